"""Issue 60, round 5: an ORT file's bytes the same in every process that builds it (and the
lock job's message naming what differs); ``doit diff`` showing the checks of a build that
failed verification; the report page's numbers never broken across lines, and one word for
a move of nothing."""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgebuild.cache.store import FAILED_DIR, FAILED_REPORTS_KEPT, Store
from edgebuild.core.hashing import file_digest
from edgebuild.core.report import Check, Report
from edgebuild.kinds.ort_format.canonical import UnknownLayout, read_head, write_canonical
from edgebuild.run.diff import FROM_STORE, diff
from edgebuild.run.diff import render as render_diff
from edgebuild.run.lockfile import lock_change_described, lock_changes, rebuilt_with_other_bytes, update_lock
from edgebuild.run.workspace import Workspace

from helpers import CLIP_TO_QDQ, commit, flip_bits, lay_out_project, needs

# --- (1) the ORT file, reproducible -----------------------------------------------------

# onnxruntime's converter, in a process of its own: the order it writes the kernel
# type-string table in follows a hash seed drawn per process.
CONVERT = """\
import contextlib, io, sys
from pathlib import Path
from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort
with contextlib.redirect_stdout(io.StringIO()):
    convert_onnx_models_to_ort(Path(sys.argv[1]), output_dir=Path(sys.argv[2]), optimization_styles=[OptimizationStyle.Fixed])
"""


def _many_operators_graph(path: Path) -> None:
    """A small graph of a dozen operator types: a kernel type-string table of a dozen
    entries, whose order in the converter's file varies from process to process."""
    import numpy
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(numpy.linspace(-1, 1, 16, dtype=numpy.float32).reshape(4, 4), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Sigmoid", ["r"], ["s"]),
        helper.make_node("Tanh", ["s"], ["t"]), helper.make_node("Mul", ["t", "a"], ["u"]),
        helper.make_node("Sub", ["u", "x"], ["v"]), helper.make_node("Abs", ["v"], ["b"]),
        helper.make_node("Exp", ["b"], ["e"]), helper.make_node("Div", ["e", "s"], ["d"]),
        helper.make_node("Softmax", ["d"], ["o"], axis=-1), helper.make_node("Transpose", ["o"], ["p"], perm=[1, 0]),
        helper.make_node("Concat", ["p", "p"], ["y"], axis=0),
    ]
    graph = helper.make_graph(nodes, "many", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_the_ort_file_is_laid_out_one_way_whichever_process_converted_it(tmp_path: Path) -> None:
    import numpy
    import onnxruntime

    _many_operators_graph(tmp_path / "model.onnx")
    raw, canonical = [], []
    # (Measured: four conversions of this graph in four processes, four digests.)
    for run in range(2):
        out = tmp_path / f"run{run}"
        subprocess.run([sys.executable, "-c", CONVERT, str(tmp_path / "model.onnx"), str(out)], check=True,
                       capture_output=True, timeout=120)
        [converted] = out.glob("*.ort")
        raw.append(converted)
        canonical.append(tmp_path / f"canonical{run}.ort")
        write_canonical(converted, canonical[-1])
    digests = {hashlib.sha256(path.read_bytes()).hexdigest() for path in canonical}
    assert len(digests) == 1, "one graph, converted in two processes, must give one file"
    # Rewriting a rewritten file changes nothing; what the head says is the converter's.
    write_canonical(canonical[0], tmp_path / "again.ort")
    assert (tmp_path / "again.ort").read_bytes() == canonical[0].read_bytes()
    head, converted_head = read_head(canonical[0].read_bytes()), read_head(raw[0].read_bytes())
    assert (head.ort_version, head.resolver) == (converted_head.ort_version, converted_head.resolver)
    # As onnxruntime reads it: the operators sorted by their key.
    operators = [op.op_id for op in head.resolver]
    assert operators == sorted(operators) and b":Softmax:13" in operators and len(operators) >= 10
    # onnxruntime loads the rewritten file and computes what it computes from the converter's.
    feed = {"x": numpy.linspace(-2, 2, 16, dtype=numpy.float32).reshape(4, 4)}
    for converted, rewritten in zip(raw, canonical):
        expected = onnxruntime.InferenceSession(str(converted), providers=["CPUExecutionProvider"]).run(None, feed)
        found = onnxruntime.InferenceSession(str(rewritten), providers=["CPUExecutionProvider"]).run(None, feed)
        assert numpy.array_equal(expected[0], found[0])


def test_an_ort_head_with_a_field_the_rewrite_does_not_know_is_refused(tmp_path: Path) -> None:
    import flatbuffers

    builder = flatbuffers.Builder(64)
    version = builder.CreateString("6")
    builder.StartObject(5)
    builder.PrependUint32Slot(4, 7, 0)  # a field a later ORT format might add
    builder.PrependUOffsetTRelativeSlot(0, version, 0)
    builder.minalign = 8
    builder.Finish(builder.EndObject(), file_identifier=b"ORTM")
    (tmp_path / "later.ort").write_bytes(bytes(builder.Output()))
    with pytest.raises(UnknownLayout) as refused:
        write_canonical(tmp_path / "later.ort", tmp_path / "out.ort")
    assert str(refused.value) == "the root table has field 4, which this rewrite does not know (it knows 0, 1, 3)"
    with pytest.raises(UnknownLayout, match="does not start as an ORT file"):
        read_head(b"\0" * 64)


ORT_MANIFEST = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  clip_onnx:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
  clip_ort:
    kind: ort_format
    source: clip_onnx
"""


@pytest.mark.slow
def test_two_builds_of_an_ort_artifact_in_fresh_processes_pass_the_lock_job(tmp_path: Path) -> None:
    project = lay_out_project(tmp_path, ORT_MANIFEST)
    # A fork server of each command's own: its workers share its hash seed, and the next
    # command's server is another interpreter (a shared server would build both).
    env = {"EDGEBUILD_FORK_SERVER": "process", "EDGEBUILD_REMOTE_CACHE": "off"}
    first = project.doit("verify", env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    lock = (tmp_path / "artifacts.lock").read_text()
    commit(tmp_path, "artifacts.yaml", "artifacts.lock", "dodo.py")
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    ort = workspace.artifact("clip_ort")
    digest = json.loads(lock)["artifacts"]["clip_ort"]["outputs"]["model.ort"]["digest"]

    # Built again from nothing (no build/, no store entry), by another process.
    workspace.store.remove(ort.fingerprint)
    subprocess.run(["rm", "-rf", str(ort.directory)], check=True)
    second = project.doit("verify", "clip_ort", env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "converted to the ORT format" in second.stderr, second.stderr
    assert json.loads((tmp_path / "artifacts.lock").read_text())["artifacts"]["clip_ort"]["outputs"]["model.ort"]["digest"] == digest
    merged = subprocess.run([sys.executable, "-m", "edgebuild", "merge-locks", str(tmp_path / "artifacts.lock")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (merged.returncode, merged.stdout) == (0, "1 shard' lock files merged into artifacts.lock: as committed\n"), \
        merged.stdout + merged.stderr

    # Other bytes under the same fingerprint are still caught, and said as such.
    shard = json.loads(lock)
    shard["artifacts"]["clip_ort"]["outputs"]["model.ort"]["digest"] = "0" * 64
    (tmp_path / "shard.lock").write_text(json.dumps(shard))
    caught = subprocess.run([sys.executable, "-m", "edgebuild", "merge-locks", str(tmp_path / "shard.lock")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert caught.returncode == 1
    assert caught.stderr == (
        f"edgebuild: error: artifacts.lock at HEAD is stale for clip_ort (same fingerprint {ort.fingerprint[:12]}, "
        "other bytes of model.ort); 1 shard' lock files merged into artifacts.lock: commit it (frozen runs pull by "
        "it): a build of the same fingerprint wrote other bytes than the committed lock names, so a doit verify "
        "elsewhere would not write this run's\n")
    # And a model.ort changed in build/ is named, and the built bytes put back.
    (tmp_path / "artifacts.lock").write_text(lock)
    flip_bits(ort.directory / "model.ort", 40)
    tampered = project.doit("verify", "clip_ort", env=env)
    assert tampered.returncode == 0, tampered.stdout + tampered.stderr
    assert "[clip_ort] build/clip_ort: model.ort changed or missing since the build; replacing it" in tampered.stderr
    assert lock_changes(json.loads(lock)["artifacts"], json.loads((tmp_path / "artifacts.lock").read_text())["artifacts"]) == []
    assert file_digest(ort.directory / "model.ort") == digest


def test_the_lock_job_names_what_differs_in_each_entry() -> None:
    entry = {"fingerprint": "ab" * 32, "params": {"opset": 21}, "outputs": {"m.bin": {"size": 1, "digest": "1"}},
             "cost": {"build_seconds": 1.0}}
    rebuilt = entry | {"outputs": {"m.bin": {"size": 1, "digest": "2"}}, "cost": {"build_seconds": 9.0}}
    changed = entry | {"fingerprint": "cd" * 32, "params": {"opset": 20}, "outputs": rebuilt["outputs"]}
    committed = {"a": entry, "b": entry, "gone": entry}
    current = {"a": rebuilt, "b": changed, "new": entry}
    assert lock_change_described(committed, current, "a") == f"a (same fingerprint {'ab' * 6}, other bytes of m.bin)"
    assert lock_change_described(committed, current, "b") == "b (fingerprint, outputs, params)"
    assert lock_change_described(committed, current, "new") == "new (new)"
    assert lock_change_described(committed, current, "gone") == "gone (no longer in the manifest)"
    assert rebuilt_with_other_bytes(entry, rebuilt) == ["m.bin"]
    assert rebuilt_with_other_bytes(entry, changed) == [] and rebuilt_with_other_bytes(None, entry) == []


# --- (2) the checks of a build that failed verification, in doit diff ------------------

def _report(directory: Path, fingerprint: str, value: float, name: str = "a", verify_fingerprint: str = "v" * 64) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    Report(artifact=name, kind="hf_onnx", fingerprint=fingerprint, checks=[Check.measure("cosine", value, ">=", 0.99)],
           extra={"verify_fingerprint": verify_fingerprint}).write(directory)
    return directory / "report.json"


def test_the_store_keeps_the_latest_failed_reports_apart_from_every_entry(tmp_path: Path) -> None:
    store = Store(tmp_path / "store")
    fingerprints = [hashlib.sha256(str(index).encode()).hexdigest() for index in range(FAILED_REPORTS_KEPT + 2)]
    for index, fingerprint in enumerate(fingerprints):
        store.keep_failed_report(fingerprint, _report(tmp_path / "b" / str(index), fingerprint, 0.5))
        # The oldest first, seconds apart.
        os.utime(tmp_path / "store" / FAILED_DIR / f"{fingerprint}.json", (1000 + index, 1000 + index))
    kept = sorted(path.stem for path in (tmp_path / "store" / FAILED_DIR).iterdir())
    # Pruned on each write: what the last write saw was the latest, and one more.
    assert len(kept) <= FAILED_REPORTS_KEPT + 1 and fingerprints[0] not in kept and fingerprints[-1] in kept
    assert store.failed_report(fingerprints[-1])["checks"][0]["value"] == 0.5
    # Nothing that asks whether a build is verified sees it: no entry, no entry's report.
    assert store.report(fingerprints[-1]) is None and store.entry(fingerprints[-1]) is None
    # A report that passed, another build's report, a name that is not a fingerprint: not kept.
    other = hashlib.sha256(b"other").hexdigest()
    store.keep_failed_report(other, _report(tmp_path / "passed", other, 1.0))
    store.keep_failed_report(other, _report(tmp_path / "another", fingerprints[0], 0.5))
    store.keep_failed_report("../x", _report(tmp_path / "odd", "../x", 0.5))
    assert store.failed_report(other) is None and store.failed_report("../x") is None
    assert not (tmp_path / "store" / FAILED_DIR / f"{other}.json").exists()
    # A file there that says it passed is not taken as a failed report either.
    (tmp_path / "store" / FAILED_DIR / f"{other}.json").write_text(_report(tmp_path / "p2", other, 1.0).read_text())
    assert store.failed_report(other) is None


def _judged_clip(workspace: Workspace, passed: bool) -> None:
    from test_chain import _judged

    _judged(workspace, "clip", passed=passed)


def test_diff_shows_the_checks_of_the_failed_build_it_started_from(tmp_path: Path) -> None:
    """The loop of fixing a failing build: the committed lock names a build that FAILED;
    the store kept that verification's report apart, so the diff shows its checks old ->
    new and the verdict FAILED -> verified; without that report, one note says why the old
    values are absent."""
    lay_out_project(tmp_path, CLIP_TO_QDQ)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    _judged_clip(workspace, passed=False)
    clip = workspace.artifact("clip")
    old = clip.fingerprint
    # As `doit verify` leaves a build that failed: stored (at its export), its report apart.
    workspace.store.put(old, clip.directory)
    workspace.store.keep_failed_report(old, clip.directory / "report.json")
    update_lock(workspace, [clip])
    commit(tmp_path, "artifacts.yaml", "artifacts.lock")
    (tmp_path / "artifacts.yaml").write_text(CLIP_TO_QDQ.replace("    outputs: [pooler_output]\n",
                                                                 "    outputs: [pooler_output]\n    opset: 20\n", 1))
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    _judged_clip(workspace, passed=True)
    clip = workspace.artifact("clip")

    change = diff(workspace, [clip], against="HEAD")["clip"]
    assert (change.change, change.before_from, change.before_failed, change.verified_before) == ("changed", FROM_STORE, True, False)
    cosine = change.check("cosine")
    assert (cosine.before, cosine.after, cosine.passed_before, cosine.passed_after) == (0.5, 1.0, False, True)
    assert change.notes == () and change.to_json()["before_failed"] is True
    rendered = render_diff(diff(workspace, [clip], against="HEAD"))
    assert rendered[1].endswith("(now verified)  verdict FAILED → verified"), rendered
    assert "    check cosine: 0.5 → 1 (+0.5)  FAIL → pass" in rendered, rendered

    # No report of the failed verification kept here: its old values are absent, and one line says why.
    (Path(workspace.store.root) / FAILED_DIR / f"{old}.json").unlink()
    result = diff(workspace, [clip], against="HEAD")
    change = result["clip"]
    assert change.check("cosine").before is None and not change.before_failed
    assert change.notes == (
        f"it FAILED verification at {result.against}, and the report of that verification is not kept here (the store keeps those "
        f"of the latest {FAILED_REPORTS_KEPT} failed verifications run on this machine): its checks then are not "
        "shown (its thresholds are, from the lock entry)",)
    rendered = render_diff(diff(workspace, [clip], against="HEAD"))
    assert sum(line.startswith("    note: ") for line in rendered) == 1, rendered
    assert "    check cosine: – → 1" in rendered, rendered


def test_diff_says_why_there_are_no_old_checks_of_a_build_never_verified(tmp_path: Path) -> None:
    from helpers import pretend_built

    lay_out_project(tmp_path, CLIP_TO_QDQ)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    clip = workspace.artifact("clip")
    clip.directory.mkdir(parents=True)
    (clip.directory / "model.onnx").write_bytes(b"graph of clip")
    pretend_built(workspace, "clip", {"model.onnx": file_digest(clip.directory / "model.onnx")})
    clip = workspace.artifact("clip")
    # Built (and stored, as an export stores it), never verified.
    workspace.store.put(clip.fingerprint, clip.directory)
    update_lock(workspace, [clip])
    commit(tmp_path, "artifacts.yaml", "artifacts.lock")
    assert json.loads((tmp_path / "artifacts.lock").read_text())["artifacts"]["clip"]["verified"] is None
    (tmp_path / "artifacts.yaml").write_text(CLIP_TO_QDQ.replace("    outputs: [pooler_output]\n",
                                                                 "    outputs: [pooler_output]\n    opset: 20\n", 1))
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    _judged_clip(workspace, passed=True)
    result = diff(workspace, [workspace.artifact("clip")], against="HEAD")
    change = result["clip"]
    assert result.against.startswith("HEAD (")
    assert (change.before_from, change.notes) == (
        FROM_STORE, (f"it was not verified at {result.against}: there are no checks then to show",))
    assert change.check("cosine").before is None


@pytest.mark.slow
def test_a_failed_verification_s_checks_reach_the_diff_through_doit(tmp_path: Path) -> None:
    """Through the real commands: `doit verify` that fails keeps the report under the
    store's failed/ (and nowhere that counts as verified); after a fix, `doit diff` shows
    the old checks and the verdict FAILED -> verified."""
    failing = ORT_MANIFEST.split("  clip_ort:")[0].replace(
        "    outputs: [pooler_output]\n", "    outputs: [pooler_output]\n    verify: {max_abs: 1.0e-12}\n")
    project = lay_out_project(tmp_path, failing)
    env = {"EDGEBUILD_REMOTE_CACHE": "off"}
    first = project.doit("verify", env=env)
    assert first.returncode != 0 and "verification failed" in first.stdout + first.stderr, first.stdout + first.stderr
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    old = workspace.artifact("clip_onnx").fingerprint
    kept = workspace.store.failed_report(old)
    assert kept is not None and kept["passed"] is False
    assert workspace.store.report(old) is None and "report.json" not in workspace.store.entry(old)["files"]
    status = project.doit("status", env=env)
    assert "clip_onnx  up to date (verification FAILED)" in status.stdout, status.stdout + status.stderr
    commit(tmp_path, "artifacts.yaml", "artifacts.lock", "dodo.py")

    project.manifest(failing.replace("max_abs: 1.0e-12}", "max_abs: 0.1}\n    opset: 20"))
    fixed = project.doit("verify", env=env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    shown = project.doit("diff", env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    head = next(line for line in shown.stdout.splitlines() if line.startswith("clip_onnx"))
    assert head.endswith("(now verified)  verdict FAILED → verified"), shown.stdout
    [flipped] = [line for line in shown.stdout.splitlines() if line.startswith("    check pooler_output.max_abs: ")]
    # The old value is the failed verification's (as measured, not "–"), and its verdict flipped.
    assert " – → " not in flipped and flipped.endswith("  FAIL → pass"), shown.stdout
    assert "max_abs" in next(check["name"] for check in kept["checks"] if not check["passed"])


# --- (3) the report page: numbers whole, one word for no move ---------------------------

def test_a_move_of_nothing_is_unchanged_on_the_page_as_in_doit_diff() -> None:
    from edgebuild.cli.report_page.page import _parts
    from edgebuild.run.diff import ArtifactDiff, CheckChange, Diff

    same = CheckChange("cosine", 0.9995, 0.9995, 0.0, ">=", 0.99, True, True)
    moved = CheckChange("max_abs", -0.0012, 1.2e-05, 1.2e-05 + 0.0012, "<=", 0.1, True, True)
    change = ArtifactDiff("a", "hf_onnx", "changed", "ab" * 32, "cd" * 32, ("opset 21 → 20",), checks=(same, moved))
    cell = str(_parts().delta_cell(same, change))
    assert ">unchanged</span>" in cell and "±" not in cell
    details = str(_parts().change_details(change, Diff("HEAD", "0" * 40, (change,))))
    assert "<td>cosine</td><td>0.99950000</td><td>0.99950000</td><td>unchanged</td>" in details, details
    assert "<td>max_abs</td><td>-0.0012</td><td>1.200e-05</td><td>+0.00121</td>" in details, details
    templates = Path(__file__).resolve().parent.parent / "edgebuild" / "cli" / "report_page" / "templates"
    assert not any("±" in path.read_text() for path in templates.iterdir())
    rendered = render_diff(Diff("HEAD", "0" * 40, (change,)))
    assert "±" not in "\n".join(rendered)


# Run in a copy of the page: every number of the tables, with the lines its text takes.
NUMBER_PROBE = """<script>
document.querySelectorAll("details").forEach(element => { element.open = true; });
const cells = [...document.querySelectorAll(".num, table.checks td:nth-child(2), table.check-changes td:nth-child(n+2)")];
const lines = element => {
  const range = document.createRange();
  range.selectNodeContents(element);
  return new Set([...range.getClientRects()].filter(box => box.width > 0).map(box => Math.round(box.top))).size;
};
const probe = document.createElement("pre");
probe.id = "number-probe";
probe.textContent = JSON.stringify(cells.map(element => [element.textContent.trim(), lines(element)]));
document.body.appendChild(probe);
</script>"""


@needs("chromium")
def test_numbers_are_never_broken_across_lines_in_a_narrow_window(tmp_path: Path, siglip_checkpoint: Path) -> None:
    from test_report_page import GENERATED_AT, _chromium, _siglip_project, _write_built

    from edgebuild.cli.report_page import write_report_page

    project = _siglip_project(tmp_path, siglip_checkpoint, tower=False)
    checks = [Check.measure("calibration.mean_error_of_the_quantized_encoder", -0.0012, ">=", 0.0, "a long detail " * 6),
              Check.measure("held_out.max_relative_error_of_the_encoder", 1.2e-05, "<=", 1e-06)]
    _write_built(project, "q", {"quantization.json": {"objectives": {}}}, checks, {})
    page = write_report_page(project, GENERATED_AT)
    probe_page = page.with_name("number-probe.html")
    probe_page.write_text(page.read_text().replace("</body>", NUMBER_PROBE + "</body>"))
    dom = _chromium("--window-size=300,2000", "--dump-dom", probe_page.as_uri(), profile=tmp_path / "profile").stdout
    found = re.search(r'<pre id="number-probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe did not run; the DOM ends: {dom[-500:]}"
    measured = json.loads(html.unescape(found.group(1)))
    texts = [text for text, _ in measured]
    assert "-0.0012" in texts and "1.200e-05" in texts, measured
    assert [entry for entry in measured if entry[1] != 1] == [], measured
