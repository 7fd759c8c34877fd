"""Verified along the whole chain, and on data.

- The chain rule: an artifact whose source (or any artifact it is made from) is not
  verified is not verified either: ``doit verify`` does not run it (counted "not run",
  exit non-zero), nothing of it is kept or pushed as verified, ``doit publish`` and a
  consumer's fetch refuse it, ``doit status`` names the ancestor and why.
- Judged against the float model at the root of its chain: ``vs_float.<output>.<metric>``.
- Thresholds that fit the outputs: per output, relative to the output's scale, and a
  constant reference named as such.
- Gates on a dataset (a built-in one shipped in an installed package, or the user's),
  judged by the bounds of seeded paired bootstrap intervals.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy
import pytest
import torch

from edgebuild.core.hashing import file_digest
from edgebuild.core.manifest import load_manifest
from edgebuild.core.report import Check, Report, format_number
from edgebuild.core.thresholds import OutputLimits, PerOutputLimits
from edgebuild.errors import ManifestError, PublishError
from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.ml.statistics import bootstrap, embeddings, nearest_labels, sample_cosines
from edgebuild.run.state import VerificationState, status, verification_state
from edgebuild.run.workspace import Workspace
from edgebuild.testing import TinyProject

from helpers import CLIP_TO_QDQ, lay_out_project, pretend_built

CHAIN = CLIP_TO_QDQ + """\
  npu:
    kind: qnn_context
    source: qdq
"""


def _lay_out(root: Path, manifest: str = CHAIN) -> TinyProject:
    return lay_out_project(root, manifest)


# --- the numbers ------------------------------------------------------------------------


def test_bootstrap_intervals_are_seeded_paired_and_hold_the_mean() -> None:
    values = numpy.array([0.9, 0.95, 0.99, 1.0, 0.97, 0.93, 0.96, 0.98])
    first = bootstrap({"a": values, "b": values - 0.01}, resamples=500, seed=3)
    again = bootstrap({"a": values, "b": values - 0.01}, resamples=500, seed=3)
    assert first == again
    assert first["a"].mean == pytest.approx(values.mean())
    assert first["a"].low < first["a"].mean < first["a"].high
    # Paired: the same draws for both series, so a constant shift shifts the interval exactly.
    assert first["b"].low == pytest.approx(first["a"].low - 0.01)
    assert first["b"].high == pytest.approx(first["a"].high - 0.01)
    # A series with no spread has no width.
    flat = bootstrap({"c": numpy.ones(10)}, resamples=100, seed=0)["c"]
    assert (flat.mean, flat.low, flat.high) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"one value per sample, found lengths \[2, 3\]"):
        bootstrap({"a": numpy.ones(2), "b": numpy.ones(3)}, resamples=100, seed=0)


def test_per_sample_cosines_and_nearest_neighbour_labels() -> None:
    reference = numpy.array([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    actual = numpy.array([[2.0, 0.0], [0.0, 0.0], [0.0, 0.0], [3.0, -3.0]])
    assert sample_cosines(reference, actual).tolist() == [1.0, 1.0, 0.0, 0.0]
    # Tokens are averaged into one vector per sample.
    assert embeddings(numpy.arange(12.0).reshape(2, 3, 2)).tolist() == [[2.0, 3.0], [8.0, 9.0]]
    gallery = numpy.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    labels = numpy.array([0, 0, 1, 1])
    # Leave-one-out: each sample's nearest other sample.
    assert nearest_labels(gallery, labels, gallery).tolist() == [0, 0, 1, 1]
    swapped = gallery[[2, 3, 0, 1]]
    assert nearest_labels(gallery, labels, swapped).tolist() == [1, 1, 0, 0]


def test_errors_relative_to_the_outputs_scale() -> None:
    reference = torch.tensor([[300.0, -347.0, 12.0]], dtype=torch.float64)
    actual = reference + torch.tensor([[0.001, -0.001, 0.0]], dtype=torch.float64)
    measured = worst_agreement([agreement(reference, actual)])
    assert measured["max_rel"] == pytest.approx(0.001 / 347.0)
    checks = output_checks("logits", measured, OutputLimits(cosine_min=0.9999, max_rel=1e-4), "vs the model")
    assert [(check.name, check.passed) for check in checks] == [("logits.cosine", True), ("logits.max_rel", True)]
    # The absolute limit a model of small outputs takes fails this one at a relative error of 3e-6.
    assert not output_checks("logits", measured, OutputLimits(max_abs=1e-4), "")[0].passed


def test_a_constant_reference_is_named_not_a_cosine_of_zero() -> None:
    zeros = torch.zeros(1, 4)
    measured = worst_agreement([agreement(zeros, zeros)])
    (check,) = output_checks("pooler_output", measured, OutputLimits(cosine_min=0.99, max_rel=1e-4), "vs the model")
    assert (check.name, check.passed) == ("pooler_output.reference", False)
    assert check.describe() == (
        "pooler_output.reference = constant (limit == varying): the reference pooler_output is constant (every "
        "element 0): its cosine and relative error say nothing; set max_abs for this output to judge it")
    judged = output_checks("pooler_output", measured, OutputLimits(cosine_min=0.99, max_abs=1e-6), "vs the model")
    assert [(item.name, item.value, item.passed) for item in judged] == [("pooler_output.max_abs", 0.0, True)]
    assert judged[0].detail.startswith("the reference pooler_output is constant (every element 0); vs the model")
    # A constant that is not zero has a scale: the relative error still judges it.
    twos = torch.full((1, 4), 2.0)
    measured = worst_agreement([agreement(twos, twos + 0.002)])
    assert [item.name for item in output_checks("x", measured, OutputLimits(cosine_min=0.99, max_rel=1e-2), "")] == \
        ["x.max_rel"]


def test_limits_per_output_win_over_those_for_every_output_and_the_defaults() -> None:
    limits = PerOutputLimits(max_rel=1e-3, outputs={"logits": OutputLimits(cosine_min=0.9)})
    defaults = OutputLimits(cosine_min=0.99, max_rel=1e-4)
    assert limits.for_output("logits", defaults) == OutputLimits(cosine_min=0.9, max_rel=1e-3)
    assert limits.for_output("pooler_output", defaults) == OutputLimits(cosine_min=0.99, max_rel=1e-3)


# --- the manifest -----------------------------------------------------------------------


@pytest.mark.parametrize("verify, message", [
    ("{dataset: {builtin: skimage}}", "verify -> dataset: expected at least one gate: min_cosine, min_agreement or "
                                      "max_drop (a dataset measured without a gate would only warn)"),
    ("{dataset: {builtin: digits, images: [a.png], min_cosine: 0.9}}",
     "verify -> dataset: expected exactly one of builtin, images, tensors; found builtin, images"),
    ("{dataset: {builtin: mnist, min_cosine: 0.9}}", "verify -> dataset -> builtin: "),
    ("{dataset: {builtin: skimage, labels: directory, min_cosine: 0.9}}",
     "verify -> dataset: labels: directory takes labels from the images' directories; give images"),
    ("{outputs: {logits: {cosine_min: 0.9}}}",
     "verify.outputs: 'logits' is not one of the outputs (pooler_output)"),
    ("{vs_float: {max_rel: -1}}", "verify -> vs_float -> max_rel: "),
])
def test_bad_verification_settings_are_one_line_naming_the_key(tmp_path: Path, verify: str, message: str) -> None:
    (tmp_path / "artifacts.yaml").write_text(CHAIN.replace("    outputs: [pooler_output]\n",
                                                           f"    outputs: [pooler_output]\n    verify: {verify}\n"))
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    text = str(caught.value)
    assert "\n" not in text and message in text, text
    assert text.startswith(f"{tmp_path / 'artifacts.yaml'}:")


def test_the_built_in_sets_are_read_where_their_packages_are_installed() -> None:
    from edgebuild.core.datasets import builtin_files
    from edgebuild.core.thresholds import DatasetGate
    from edgebuild.ml.datasets import load_samples

    photos = builtin_files("skimage")
    assert {"astronaut.png", "camera.png", "chelsea.png", "coffee.png", "rocket.jpg"} <= {path.name for path in photos}
    assert all(path.suffix in (".png", ".jpg") for path in photos)
    digits = builtin_files("digits")
    assert [path.name for path in digits] == ["digits.csv.gz"]
    gate = DatasetGate(builtin="digits", samples=40, seed=1, min_cosine=0.9)
    samples = load_samples(gate, digits, [])
    assert len(samples) == 40 and samples.description == "builtin:digits (40 of 1797 samples, drawn at random)"
    assert samples.labels == load_samples(gate, digits, []).labels and set(samples.labels) <= set(range(10))
    assert samples.images[0].mode == "RGB" and samples.images[0].size == (8, 8)
    other = load_samples(DatasetGate(builtin="digits", samples=40, seed=2, min_cosine=0.9), digits, [])
    assert other.labels != samples.labels


# --- the chain rule, on builds laid out by hand -----------------------------------------


def _judged(workspace: Workspace, name: str, passed: bool) -> None:
    """``build/<name>/`` holding a model.onnx, built at its current fingerprint, and a
    report at its current verification fingerprint that ``passed`` (or not)."""
    directory = workspace.artifact(name).directory
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.onnx").write_bytes(f"graph of {name}".encode())
    pretend_built(workspace, name, {"model.onnx": file_digest(directory / "model.onnx")})
    artifact = workspace.artifact(name)
    Report(artifact=name, kind=artifact.kind.name, fingerprint=artifact.fingerprint,
           checks=[Check.measure("cosine", 1.0 if passed else 0.5, ">=", 0.99)],
           extra={"verify_fingerprint": artifact.verify_fingerprint,
                  "verify": artifact.params.verify_parameters(),
                  "verify_parts": workspace.verify_parts(artifact)}).write(directory)


@pytest.mark.parametrize("failing, said", [
    ("qdq", "not verified while its source qdq FAILED verification (see build/qdq/report.md)"),
    ("clip", "not verified while clip (up its chain) FAILED verification (see build/clip/report.md)"),
])
def test_an_artifact_is_verified_only_with_its_whole_chain(tmp_path: Path, failing: str, said: str) -> None:
    from edgebuild.run.publish import check_publishable

    _lay_out(tmp_path)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    for name in ("clip", "qdq", "npu"):
        _judged(workspace, name, passed=name != failing)
    assert verification_state(workspace, workspace.artifact("npu")) is VerificationState.SOURCE_NOT_VERIFIED
    state = status(workspace, workspace.artifact("npu"))
    assert (state.state, state.note, state.reasons, state.verified) == ("up to date", "source not verified", (said,), False)
    with pytest.raises(PublishError) as caught:
        check_publishable(workspace, [workspace.artifact("npu")])
    assert str(caught.value) == f"nothing published:\n  npu: {said}"
    # The ancestor passes again: its consumer counts, without being judged again.
    _judged(workspace, failing, passed=True)
    assert verification_state(workspace, workspace.artifact("npu")) is VerificationState.VERIFIED


def test_status_says_why_a_build_is_judged_again(tmp_path: Path) -> None:
    """A threshold set where the default was, a held-out image added two steps up: each is
    named, not "not verified" alone."""
    _lay_out(tmp_path)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    for name in ("clip", "qdq", "npu"):
        _judged(workspace, name, passed=True)
    assert status(workspace, workspace.artifact("npu")).verified
    (tmp_path / "artifacts.yaml").write_text(CHAIN.replace("  npu:\n    kind: qnn_context\n    source: qdq\n",
                                                          "  npu:\n    kind: qnn_context\n    source: qdq\n"
                                                          "    verify: {vs_float: {cosine_min: 0.995}}\n"))
    shutil.copy(tmp_path / "held_out" / "scene_100.png", tmp_path / "held_out" / "scene_102.png")
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    assert status(workspace, workspace.artifact("qdq")).reasons == (
        "the files only verification reads changed (held-out inputs, or its sources' input files)",)
    assert status(workspace, workspace.artifact("npu")).reasons == (
        "verify.vs_float.cosine_min None → 0.995",
        "the files only verification reads changed (held-out inputs, or its sources' input files)",
        "not verified while its source qdq is not verified at its current verification fingerprint")


def test_a_fetch_refuses_a_release_whose_chain_did_not_pass(tmp_path: Path) -> None:
    from edgebuild.run.fetch import _verdict_distrust

    def entry(report: dict, inputs: dict) -> Path:
        directory = tmp_path / str(len(list(tmp_path.iterdir())))
        directory.mkdir()
        (directory / "report.json").write_text(json.dumps(report))
        (directory / "provenance.json").write_text(json.dumps({"inputs": inputs}))
        return directory

    made_from = {"source": {"outputs": {}}}
    passing = {"passed": True, "checks": [{"name": "cosine", "value": 0.999, "limit": 0.99, "comparison": ">=",
                                           "passed": True}]}
    assert _verdict_distrust(entry(passing, {"checkpoint": {}})) is None
    assert _verdict_distrust(entry(passing | {"chain": [{"artifact": "qdq", "passed": True}]}, made_from)) is None
    assert _verdict_distrust(entry(passing | {"chain": [{"artifact": "qdq", "passed": False}]}, made_from)) == \
        "qdq, which it is made from, had not passed verification when it was judged"
    assert _verdict_distrust(entry(passing, made_from)) == (
        "it is made from a source and its report records no verdict of the artifacts it is made from (published "
        "before edgebuild judged chains); publish it again")
    failing = {"passed": False, "checks": [dict(passing["checks"][0], value=0.5, passed=False)]}
    assert _verdict_distrust(entry(failing, {})) == "its report.json does not say it passed verification"
    # Signed, and edited before signing: the verdict is re-derived from the checks, not read.
    assert _verdict_distrust(entry(failing | {"passed": True}, {})) == (
        "its report.json's verdict does not follow from its checks (it says passed: true, but its checks say false)")
    edited = {"passed": True, "checks": [dict(failing["checks"][0], passed=True)]}
    assert _verdict_distrust(entry(edited, {})) == (
        "its report.json's verdict does not follow from its checks (check cosine says it passed, but 0.5 >= 0.99000000 "
        "does not hold)")
    assert _verdict_distrust(entry({"passed": True, "checks": []}, {})) == (
        "its report.json's verdict does not follow from its checks (it says passed: true, but its checks say false)")


# --- end to end: doit, real models ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("failing, line", [
    ("qdq", "verify: 1 passed, 1 failed (qdq), 1 not run (npu)"),
    ("clip", "verify: 0 passed, 1 failed (clip), 2 not run (qdq, npu)"),
])
def test_a_failed_source_stops_its_consumers(tmp_path: Path, failing: str, line: str) -> None:
    """The issue's case: the QDQ graph fails its check; the QNN context compiled from it is
    not run, not pushed, not published -- and the same with the failure two steps up."""
    impossible = {"qdq": "      images: [held_out/*.png]\n    verify: {cosine_min: 1.0}\n",
                  "clip": "    outputs: [pooler_output]\n    verify: {max_rel: 0.0}\n"}[failing]
    anchor = "      images: [held_out/*.png]\n" if failing == "qdq" else "    outputs: [pooler_output]\n"
    project = _lay_out(tmp_path / "project", CHAIN.replace(anchor, impossible))
    remote = tmp_path / "remote"
    remote.mkdir()
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    verified = project.doit("verify", env=env)
    assert verified.returncode != 0
    lines = verified.stdout.splitlines()
    assert lines[-1] == line, verified.stdout + verified.stderr
    if failing == "qdq":
        assert "  [npu] not run: its source qdq did not pass verification" in lines
        assert (project.root / "build" / "npu" / ".edgebuild.json").is_file()  # built, never judged
    assert not (project.root / "build" / "npu" / "report.json").exists()
    # Only what verified along its whole chain reached the remote cache.
    pushed = {path.stem for path in (remote / "v1" / "entries").rglob("*.json")}
    fingerprints = {name: json.loads((project.root / "build" / name / ".edgebuild.json").read_text())["fingerprint"]
                    for name in ("clip", "qdq", "npu") if (project.root / "build" / name / ".edgebuild.json").is_file()}
    assert pushed == ({fingerprints["clip"]} if failing == "qdq" else set())
    state = project.doit("status", "--check", "npu")
    assert state.returncode == 1 and f"FAILED verification (see build/{failing}/report.md)" in state.stdout
    published = project.doit("publish", "--to", str(tmp_path / "published"), "--allow-dirty", "npu")
    assert published.returncode != 0 and not (tmp_path / "published" / "npu").exists()
    assert "nothing published:" in published.stdout + published.stderr


@pytest.mark.slow
def test_a_qnn_context_is_judged_against_transformers_as_a_user_checks_it(tmp_path: Path) -> None:
    """vs_float of the QNN context: the HTP simulator against CLIPVisionModel's own forward,
    on the QDQ graph's held-out images -- the same numbers a user's own script prints."""
    from transformers import CLIPImageProcessor, CLIPVisionModel

    from edgebuild.kinds.qnn_context.qnn import htp_session
    from edgebuild.ml.images import load_rgb_image

    # A latency gate no graph meets: a simulator is not timed (its time says nothing of the
    # device), and so not gated.
    project = _lay_out(tmp_path, CHAIN + "    verify: {latency: {max_ratio: 1.0e-6, runs: 3}}\n")
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads((tmp_path / "build" / "npu" / "report.json").read_text())
    checks = {check["name"]: check for check in report["checks"]}
    assert report["passed"] and checks["vs_float.pooler_output.cosine"]["limit"] == 0.98
    latency = report["latency"]
    assert latency["simulated"] is True and latency["measured"] is False and "latency.ratio" not in checks
    assert latency["reason"].startswith("QNN HTP simulator") and "simulates the device" in latency["reason"]
    assert "  [npu] latency: not measured: QNN HTP simulator" in verified.stderr
    assert report["metrics"]["vs_float"]["inputs"] == "2 held_out inputs (of qdq)"
    assert [entry["artifact"] for entry in report["chain"]] == ["qdq", "clip"]
    assert all(entry["passed"] for entry in report["chain"])

    # The user's own check: transformers' model and processor from the checkpoint, the
    # compiled context on the simulator.
    checkpoint = next((tmp_path / "cache" / "fixtures").glob("clip_vision_tiny-*"))
    model = CLIPVisionModel.from_pretrained(checkpoint).eval()
    processor = CLIPImageProcessor.from_pretrained(checkpoint)
    session = htp_session(tmp_path / "build" / "npu" / "model.onnx", {}, {})
    cosines = []
    for path in sorted((tmp_path / "held_out").glob("*.png")):
        pixels = processor(images=[load_rgb_image(path)], return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            expected = model(pixel_values=pixels).pooler_output
        (actual,) = session.run(None, {"pixel_values": pixels.numpy()})
        cosines.append(torch.nn.functional.cosine_similarity(expected.double().reshape(1, -1),
                                                             torch.from_numpy(actual).double().reshape(1, -1)).item())
    assert format_number(min(cosines)) == format_number(checks["vs_float.pooler_output.cosine"]["value"])


@pytest.mark.slow
def test_gates_on_builtin_sets_with_confidence_intervals(tmp_path: Path) -> None:
    """skimage's photos on the float graph, digits on its QDQ graph: offline, every number
    with its interval; a gate the interval misses fails, with the interval in the message;
    judging again after a threshold moved runs only the artifact's side."""
    manifest = (CHAIN.replace("    outputs: [pooler_output]\n",
                              "    outputs: [pooler_output]\n    verify:\n      dataset: {builtin: skimage, min_cosine: 0.999}\n")
                .replace("      images: [held_out/*.png]\n",
                         "      images: [held_out/*.png]\n    verify:\n      dataset: {builtin: digits, samples: 60, "
                         "min_cosine: 0.9, min_agreement: 0.5, max_drop: 0.5}\n"))
    project = _lay_out(tmp_path, manifest.split("  npu:")[0])
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    clip = json.loads((tmp_path / "build" / "clip" / "report.json").read_text())
    assert clip["dataset"]["name"] == "builtin:skimage" and clip["dataset"]["n"] >= 20
    interval = clip["dataset"]["metrics"]["pooler_output.cosine"]
    assert interval["ci95"][0] <= interval["mean"] <= interval["ci95"][1] and interval["ci95"][0] > 0.999
    qdq = json.loads((tmp_path / "build" / "qdq" / "report.json").read_text())
    assert qdq["dataset"]["n"] == 60 and qdq["dataset"]["description"] == \
        "builtin:digits (60 of 1797 samples, drawn at random)"
    assert {"pooler_output.cosine", "knn_agreement", "knn_accuracy", "knn_accuracy_float", "knn_drop"} <= \
        set(qdq["dataset"]["metrics"])
    checks = {check["name"]: check for check in qdq["checks"]}
    assert checks["dataset.knn_agreement"]["value"] == qdq["dataset"]["metrics"]["knn_agreement"]["ci95"][0]
    assert checks["dataset.knn_drop"]["value"] == qdq["dataset"]["metrics"]["knn_drop"]["ci95"][1]
    references = sorted((tmp_path / "cache" / "references").iterdir())
    stamps = [path.stat().st_mtime_ns for path in references]

    # A gate the interval misses: a lower bound of the cosine under 0.99999.
    project.manifest(manifest.split("  npu:")[0].replace("min_cosine: 0.9,", "min_cosine: 0.99999,"))
    failed = project.doit("verify", "qdq")
    assert failed.returncode != 0
    cosine = qdq["dataset"]["metrics"]["pooler_output.cosine"]
    assert (f"dataset.pooler_output.cosine = {format_number(cosine['ci95'][0])} (limit >= 0.99999000): lower bound; "
            f"mean {format_number(cosine['mean'])}, 95% CI [{format_number(cosine['ci95'][0])}, "
            f"{format_number(cosine['ci95'][1])}] over builtin:digits (60 of 1797 samples, drawn at random)") \
        in failed.stdout + failed.stderr
    again = json.loads((tmp_path / "build" / "qdq" / "report.json").read_text())
    assert again["dataset"]["metrics"] == qdq["dataset"]["metrics"]
    # The float model's outputs came from cache/references: nothing there was written again.
    assert sorted((tmp_path / "cache" / "references").iterdir()) == references
    assert [path.stat().st_mtime_ns for path in references] == stamps


@pytest.mark.slow
def test_a_plugin_kind_made_from_a_source_is_judged_against_the_float_model(tmp_path: Path) -> None:
    """A consumer kind from another package, writing an ONNX graph: its runner is
    onnxruntime's by default, its reference the root's transformers model."""
    from test_plugins import lay_out_plugin

    files = {
        "__init__.py": '''
from typing import Literal

from edgebuild.plugin import ONNX_GRAPH, ArtifactKind, ArtifactParams, VerifySettings


class CopyVerify(VerifySettings):
    pass


class CopyParams(ArtifactParams):
    kind: Literal["graph_copy"]
    source: str
    verify: CopyVerify = CopyVerify()


class GraphCopy(ArtifactKind):
    name = "graph_copy"
    summary = "a graph, copied"
    Params = CopyParams
    outputs = ("model.onnx", "model.onnx.data")
    build_module = "vc_plugin.build"
    verify_module = "vc_plugin.verify"
    consumes = (ONNX_GRAPH,)
''',
        "build.py": '''
import shutil

from edgebuild.plugin import BuildContext


def build(context: BuildContext) -> dict:
    (source,) = context.sources.values()
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copyfile(source / name, context.out_dir / name)
    return {}
''',
        "verify.py": '''
from edgebuild.plugin import Check, Verification, VerifyContext


def verify(context: VerifyContext) -> Verification:
    return Verification(checks=[Check.measure("copied", int((context.out_dir / "model.onnx").is_file()), "==", 1)])
''',
    }
    site = lay_out_plugin(tmp_path / "site", files=files, entry="graph_copy = vc_plugin:GraphCopy")
    project = _lay_out(tmp_path / "project", CHAIN.split("  qdq:")[0] + "  copy:\n    kind: graph_copy\n    source: clip\n"
                       "    verify: {vs_float: {cosine_min: 0.9999, max_rel: 1.0e-4}}\n")
    verified = project.doit("verify", env={"PYTHONPATH": str(site)})
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads((project.root / "build" / "copy" / "report.json").read_text())
    checks = {check["name"]: check for check in report["checks"]}
    assert set(checks) == {"outputs_intact", "copied", "vs_float.pooler_output.cosine", "vs_float.pooler_output.max_rel",
                           "vs_float.pooler_output.reference_spread"}
    assert checks["vs_float.pooler_output.max_rel"]["value"] < 1e-4
    assert report["metrics"]["vs_float"]["reference"].endswith("CLIPVisionModel.forward (float32)")
    assert report["metrics"]["vs_float"]["inputs"] == "2 random inputs (seed 0)"
