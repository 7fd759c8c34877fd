"""``doit diff``, ``Project.diff`` and the report page's comparison: what changed in an
artifact since the build a commit's lock file names (or the latest published one) -- in
its fingerprint, by name; in its outputs; in every check, old -> new."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path

import pytest

import edgebuild
from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.hashing import file_digest
from edgebuild.core.report import format_number
from edgebuild.core.staleness import tensor_groups
from edgebuild.errors import DiffError
from edgebuild.run.diff import FROM_DESTINATION, FROM_LOCK, FROM_REMOTE, FROM_STORE, diff
from edgebuild.run.diff import render as render_diff
from edgebuild.run.lockfile import update_lock
from edgebuild.run.workspace import Workspace

from helpers import TOWER_MANIFEST, ProjectDir, clone_project, commit, lay_out_siglip_inputs, pretend_built, skip_unless_present
from test_report_page import _chromium, _sections
from test_staleness import patch_tensor_bytes

BLOCK = "model.visual.blocks.0."
# Measures the page as a reader first sees it (details folded) and unfolded.
HEIGHT_PROBE = """<script>
const probe = document.createElement("pre");
probe.id = "height-probe";
const height = () => document.body.getBoundingClientRect().height;
const folded = height();
document.querySelectorAll("details").forEach(element => { element.open = true; });
probe.textContent = JSON.stringify({folded: folded, unfolded: height()});
document.body.appendChild(probe);
</script>"""


def test_tensor_groups_are_the_fewest_whole_modules() -> None:
    names = {f"m.blocks.{block}.{part}.{leaf}" for block in range(3) for part in ("q", "k") for leaf in ("weight", "bias")}
    names |= {"m.norm.weight", "head.weight"}
    assert tensor_groups({name for name in names if name.startswith("m.blocks.1.")}, names) == [("m.blocks.1", 4)]
    assert tensor_groups({"m.blocks.1.q.weight"}, names) == [("m.blocks.1.q.weight", 1)]
    assert tensor_groups({"m.blocks.1.q.weight", "m.blocks.1.q.bias", "m.blocks.2.k.bias"}, names) == [
        ("m.blocks.1.q", 2), ("m.blocks.2.k.bias", 1)]
    assert tensor_groups(set(names), names) == [("head.weight", 1), ("m", 13)]


@pytest.mark.slow
def test_a_tensor_group_and_a_parameter_are_named_with_every_check_old_and_new(
        verified_seed: Path, qwen_checkpoint: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    root = project.root
    # The fixture's bytes by path: the same fingerprint, so the seed's build is current.
    shutil.copytree(qwen_checkpoint, root / "ckpt")
    project.manifest(TOWER_MANIFEST.replace("fixture: qwen3_5_vl_tiny", "path: ckpt"))
    (root / ".gitignore").write_text("/build/\n/cache/\n/ckpt/\n")
    remote = tmp_path / "remote"
    remote.mkdir()
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    first = project.doit("verify", env=env)
    assert first.returncode == 0 and "exported" not in first.stdout, first.stdout + first.stderr
    commit(root, ".gitignore", "artifacts.yaml", "artifacts.lock", "dodo.py")
    published = tmp_path / "published"
    assert project.doit("publish", "--to", str(published), env=env).returncode == 0
    before = json.loads((root / "build" / "t" / "report.json").read_text())

    # One checkpoint tensor group (every tensor of the first vision block) and one parameter.
    block = sorted(name for name in Checkpoint(root / "ckpt").tensors if name.startswith(BLOCK))
    for name in block:
        patch_tensor_bytes(root / "ckpt", name)
    project.manifest(TOWER_MANIFEST.replace("fixture: qwen3_5_vl_tiny", "path: ckpt") + "    dtype: fp16\n")
    second = project.doit("verify", env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    after = json.loads((root / "build" / "t" / "report.json").read_text())
    expected = ["dtype float32 → float16", f"tensors {BLOCK}* changed ({len(block)} tensors)"]

    result = project.doit("diff", "--json", env=env)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["against"].startswith("HEAD (") and [entry["artifact"] for entry in data["artifacts"]] == ["t"]
    [t] = data["artifacts"]
    assert (t["change"], t["reasons"], t["before_from"], t["state_after"]) == ("changed", expected, FROM_STORE, "verified")
    checks = {check["name"]: check for check in t["checks"]}
    assert [check["name"] for check in before["checks"]] == [check["name"] for check in after["checks"]] == list(checks)
    for old, new in zip(before["checks"], after["checks"]):
        assert (checks[old["name"]]["before"], checks[old["name"]]["after"]) == (old["value"], new["value"])
    max_abs = checks["max_abs"]
    assert max_abs["after"] > max_abs["before"] and max_abs["delta"] == pytest.approx(max_abs["after"] - max_abs["before"])
    [graph] = [output for output in t["outputs"] if output["file"] == "model.onnx.data"]
    assert graph["changed"] and graph["size_after"] < graph["size_before"]  # fp16 weights

    text = project.doit("diff", env=env).stdout
    assert "".join(f"    - {reason}\n" for reason in expected) in text
    assert f"    check max_abs: {format_number(max_abs['before'])} → {format_number(max_abs['after'])}" in text

    # The old build from the remote cache when the local store lacks it; from the lock entry
    # alone (the same reasons, no checks) when no cache has it; from the destination.
    shutil.rmtree(root / "cache" / "store")
    [t] = json.loads(project.doit("diff", "--json", env=env).stdout)["artifacts"]
    assert (t["reasons"], t["before_from"], t["checks"][2]["before"]) == (expected, FROM_REMOTE, before["checks"][2]["value"])
    [t] = json.loads(project.doit("diff", "--json", env={"EDGEBUILD_REMOTE_CACHE": "off"}).stdout)["artifacts"]
    assert (t["reasons"], t["before_from"]) == (expected, FROM_LOCK)
    assert all(check["before"] is None for check in t["checks"])
    assert any("is not in any cache: only its lock entry is compared" in note for note in t["notes"])
    result = project.doit("diff", "--json", "--against", str(published), env={"EDGEBUILD_REMOTE_CACHE": "off"})
    [t] = json.loads(result.stdout)["artifacts"]
    assert (t["reasons"], t["before_from"], t["checks"][2]["before"]) == (expected, FROM_DESTINATION, before["checks"][2]["value"])

    # The report page says the same, folded; unfolded it is far taller.
    assert project.doit("report", env=env).returncode == 0
    page = (root / "build" / "index.html").read_text()
    section = _sections(page)["t"]
    for reason in expected:
        assert f"<li>{html.escape(reason)}</li>" in section
    assert f"<td>max_abs</td><td>{format_number(max_abs['before'])}</td><td>{format_number(max_abs['after'])}</td>" in section
    overview = page.split('<section class="overview">')[1].split("</section>")[0]
    assert f"cosine <span class=\"num\">{format_number(after['checks'][1]['value'])}</span>" in overview
    # Without a browser the page was checked as text only.
    skip_unless_present("chromium")
    probe = root / "build" / "height-probe.html"
    probe.write_text(page.replace("</body>", HEIGHT_PROBE + "</body>"))
    dom = _chromium("--dump-dom", probe.as_uri(), profile=tmp_path / "profile").stdout
    assert "dtype float32 → float16" in html.unescape(dom)
    found = re.search(r'<pre id="height-probe">(.*?)</pre>', dom, re.S)
    assert found, dom[-500:]
    heights = json.loads(html.unescape(found.group(1)))
    assert heights["folded"] * 3 <= heights["unfolded"], heights


def _siglip_lock(tmp_path: Path, siglip_checkpoint: Path, extra: str = "") -> Path:
    """A SigLIP F143 artifact (and those of ``extra``) built, as far as a record and one
    output go, and locked at HEAD."""
    root = tmp_path / "p"
    root.mkdir()
    lay_out_siglip_inputs(root, siglip_checkpoint)
    (root / "artifacts.yaml").write_text(
        "checkpoints:\n  siglip:\n    path: ckpt\nartifacts:\n  q:\n    kind: siglip_f143\n    checkpoint: siglip\n"
        "    calibration:\n      images: [\"images/*.png\"]\n" + extra)
    workspace = Workspace.open(root / "artifacts.yaml", root)
    for artifact in workspace.order():  # sources first: a source's bytes key what is made from it
        output = artifact.directory / "model.bin"
        output.parent.mkdir(parents=True)
        output.write_bytes(artifact.name.encode())
        pretend_built(workspace, artifact.name, {"model.bin": file_digest(output)})
    update_lock(workspace, workspace.order())
    commit(root, "artifacts.yaml", "artifacts.lock")
    return root


def test_one_image_added_to_a_calibration_glob_is_one_added_file(tmp_path: Path, siglip_checkpoint: Path) -> None:
    root = _siglip_lock(tmp_path, siglip_checkpoint)
    project = edgebuild.open_project(root / "artifacts.yaml")
    assert project.diff()["q"].change == "unchanged"
    shutil.copy(root / "held_out" / sorted(path.name for path in (root / "held_out").iterdir())[0], root / "images" / "zz_new.png")
    result = edgebuild.open_project(root / "artifacts.yaml").diff()
    change = result["q"]
    assert (change.change, change.reasons) == ("changed", ("calibration.images: images/zz_new.png added",))
    # The lock entry names the files: without the store, the same words.
    shutil.rmtree(root / "cache" / "store", ignore_errors=True)
    (root / "build" / "q" / ".edgebuild.json").unlink()
    change = edgebuild.open_project(root / "artifacts.yaml").diff()["q"]
    assert change.reasons == ("calibration.images: images/zz_new.png added",) and change.before_from == FROM_LOCK
    assert change.state_after == "not built"


def test_an_artifact_whose_source_is_not_built_is_unknown_not_changed(tmp_path: Path, siglip_checkpoint: Path) -> None:
    root = _siglip_lock(tmp_path, siglip_checkpoint, extra="  q_onnx:\n    kind: siglip_f143_onnx\n    source: q\n")
    assert edgebuild.open_project(root / "artifacts.yaml").diff()["q_onnx"].change == "unchanged"
    shutil.copy(root / "held_out" / sorted(path.name for path in (root / "held_out").iterdir())[0], root / "images" / "zz.png")
    result = edgebuild.open_project(root / "artifacts.yaml").diff()
    assert result["q"].change == "changed"
    onnx = result["q_onnx"]
    assert (onnx.change, onnx.fingerprint_after, onnx.reasons) == ("unknown", None, ())
    assert "its source q is not built at its current fingerprint" in onnx.notes[0]


def test_what_cannot_be_compared_is_one_line(tmp_path: Path, siglip_checkpoint: Path) -> None:
    (tmp_path / "outside").mkdir()
    outside = ProjectDir(tmp_path / "outside")
    outside.manifest(TOWER_MANIFEST)
    with pytest.raises(DiffError, match="not in a git work tree"):
        diff(outside.project())

    root = _siglip_lock(tmp_path, siglip_checkpoint)
    workspace = Workspace.open(root / "artifacts.yaml", root)
    with pytest.raises(DiffError, match=r"--against nope: not a commit of the git repository"):
        diff(workspace, against="nope")
    with pytest.raises(DiffError, match="--against --output=x: not a commit"):
        diff(workspace, against="--output=x")
    with pytest.raises(DiffError, match=f"--against {tmp_path}/nowhere: .*no such directory"):
        diff(workspace, against=str(tmp_path / "nowhere"))
    with pytest.raises(DiffError, match="^--against s3://: names no bucket; expected s3://BUCKET or s3://BUCKET/PREFIX$"):
        diff(workspace, against="s3://")
    lock = json.loads((root / "artifacts.lock").read_text())
    lock["artifacts"]["q"]["fingerprint"] = "abc"
    (root / "artifacts.lock").write_text(json.dumps(lock))
    commit(root, "artifacts.lock")
    with pytest.raises(DiffError, match=r"artifacts.lock at HEAD \([0-9a-f]{12}\): artifacts.q: fingerprint is not a digest"):
        diff(workspace)
    # A commit without the lock file: every artifact is new there, and that is said.
    (tmp_path / "first").mkdir()
    first = ProjectDir(tmp_path / "first")
    first.manifest(TOWER_MANIFEST)
    commit(first.root, "artifacts.yaml")
    result = diff(first.project())
    assert [item.change for item in result.artifacts] == ["added"]
    assert result.notes == (f"artifacts.lock is not committed at {result.against}: every artifact is new there",)

    cli = ProjectDir(root)
    run = cli.doit("diff", "--against", "nope")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == f"edgebuild: error: --against nope: not a commit of the git repository at {root}\n"


def test_a_changed_config_key_is_named_with_its_values(tmp_path: Path, siglip_checkpoint: Path) -> None:
    root = _siglip_lock(tmp_path, siglip_checkpoint)
    config_path = root / "ckpt" / "config.json"
    config = json.loads(config_path.read_text())
    config["vision_config"]["layer_norm_eps"] = 1e-5
    config_path.write_text(json.dumps(config))
    change = edgebuild.open_project(root / "artifacts.yaml").diff()["q"]
    [reason] = change.reasons
    assert reason.endswith(": config.json vision_config.layer_norm_eps 1e-06 → 1e-05"), reason
    # Only the lock entry left: the same words, from the config leaves it keeps.
    shutil.rmtree(root / "cache" / "store", ignore_errors=True)
    (root / "build" / "q" / ".edgebuild.json").unlink()
    assert edgebuild.open_project(root / "artifacts.yaml").diff()["q"].reasons == (reason,)


def test_thresholds_relaxed_until_it_passes_read_as_exactly_that(tmp_path: Path) -> None:
    """Issue 60: a pull request that loosens a gate until a failing artifact passes. Against
    the commit it failed at, the diff lists the relaxed threshold and the flipped verdict --
    not the store's later, passing report of the same bytes as if it were the old one --
    and says why the old checks are not shown."""
    from test_chain import _judged

    from helpers import CLIP_TO_QDQ, lay_out_project

    lay_out_project(tmp_path, CLIP_TO_QDQ)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    _judged(workspace, "clip", passed=False)
    update_lock(workspace, [workspace.artifact("clip")])
    commit(tmp_path, "artifacts.yaml", "artifacts.lock")
    relaxed = CLIP_TO_QDQ.replace("    outputs: [pooler_output]\n", "    outputs: [pooler_output]\n"
                                  "    verify: {cosine_min: 0.4}\n", 1)
    (tmp_path / "artifacts.yaml").write_text(relaxed)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    clip = workspace.artifact("clip")
    _judged(workspace, "clip", passed=True)
    # As `doit verify` keeps a build that passed: in the store, with its report.
    workspace.store.put(clip.fingerprint, clip.directory)
    workspace.store.put_report(clip.fingerprint, clip.directory)
    change = diff(workspace, [clip], against="HEAD")["clip"]
    assert change.change == "unchanged" and change.state_after == "verified"
    assert change.verify_reasons[0] == "verify.cosine_min None → 0.4", change.verify_reasons
    assert change.verified_before is False and change.verdict_flipped
    assert change.to_json()["verdict_flipped"] is True
    assert any(note.startswith("it FAILED verification at HEAD") for note in change.notes), change.notes
    rendered = "\n".join(render_diff(diff(workspace, [clip], against="HEAD")))
    assert "verdict FAILED → verified" in rendered and "verify.cosine_min None → 0.4" in rendered
