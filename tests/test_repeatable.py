"""Numbers a user can repeat (issue 59).

- A verdict is re-derived from each check's value, limit and comparison, and the report
  files are sealed in the build record when verification writes them: an edited
  ``report.json`` is refused by ``status``, ``publish``, the lock, the API and ``fetch``.
- A float model that ignores its input (its outputs do not vary across the inputs it is
  judged on, or vanish) fails verification with one line, whatever the agreement with it.
- Names in gates are resolved when the manifest is loaded: ``never_on_cpu`` op types,
  ``vs_float`` on a root; a ``vs_float`` limit on an output nothing compares fails.
- Chain-aware defaults: an exact conversion (the ORT format) of a QDQ graph is held to the
  QDQ graph's limits against float.
- Certificates as the tools count: NNAPI and Core ML after onnxruntime's basic
  optimizations (the usability checker's own), NNAPI 8-bit QDQ only; XNNPACK's getitems
  are not fallbacks.
- Held-out inputs of any model: tensors files and texts through the checkpoint's tokenizer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy
import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.core.report import Check, holds, report_passed, verdict_problem
from edgebuild.errors import CheckpointError, ManifestError, PublishError
from edgebuild.ml.statistics import spread
from edgebuild.run.state import VerificationState, status, verification_state
from edgebuild.run.workspace import Workspace

from helpers import CLIP_TO_QDQ, lay_out_project
from test_chain import CHAIN, _judged, _lay_out


# --- verdicts re-derived ------------------------------------------------------------------


def test_a_check_cannot_pass_against_its_own_numbers() -> None:
    assert holds(0.5, "<=", 1.0) and not holds(2.0, "<=", 1.0) and not holds(float("nan"), ">=", 0.0)
    assert holds("ran", ">=", "loaded", ("none", "loaded", "ran")) and not holds("none", ">=", "loaded",
                                                                                 ("none", "loaded", "ran"))
    # A comparison it cannot decide does not hold: strings rank only by a declared order.
    assert not holds("ran", ">=", "loaded") and not holds(True, ">=", 0)
    assert holds(numpy.float32(0.995), ">=", 0.99) and holds([1, 2], "==", [1, 2])
    with pytest.raises(ValueError, match="cannot pass: 0.5 >= 0.99 does not hold"):
        Check("cosine", 0.5, 0.99, ">=", True)
    check = Check.measure("level", "loaded", ">=", "ran", order=("none", "loaded", "ran"))
    assert not check.passed and check.to_json()["order"] == ["none", "loaded", "ran"]
    assert "order" not in Check.measure("x", 1, "==", 1).to_json()
    # Read back, the verdict is derived again, never taken from the file.
    assert Check.from_json(check.to_json() | {"passed": True}) == check


def test_a_report_s_verdict_follows_from_its_checks() -> None:
    passing = {"name": "cosine", "value": 0.999, "limit": 0.99, "comparison": ">=", "passed": True}
    assert verdict_problem({"passed": True, "checks": [passing]}) is None and report_passed({"passed": True,
                                                                                           "checks": [passing]})
    assert verdict_problem({"passed": False, "checks": [passing]}) == \
        "it says passed: false, but its checks say true"
    assert verdict_problem({"passed": True, "checks": [passing | {"value": 0.5}]}) == \
        "check cosine says it passed, but 0.5 >= 0.99000000 does not hold"
    assert verdict_problem({"passed": True, "checks": []}) == "it says passed: true, but its checks say false"
    assert verdict_problem({"passed": True, "checks": [{"name": "x"}]}).startswith("check 1 is not a check")
    assert verdict_problem({"passed": True}) == "it holds no list of checks"
    assert not report_passed(None) and not report_passed({"passed": True, "checks": [passing | {"value": 0.5}]})


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize("edit, said", [
    # The issue's case: the verdict set by hand, values and limits left as judged.
    (lambda report: report.update(passed=True) or report["checks"][0].update(passed=True),
     "report.json is not the file verification wrote"),
    # The file put back as verification wrote it but for the verdict: still not the sealed bytes.
    (lambda report: report.update(passed=True), "report.json is not the file verification wrote"),
])
def test_an_edited_report_is_refused_by_status_publish_lock_and_api(tmp_path: Path, edit, said: str) -> None:
    from edgebuild.api import Project
    from edgebuild.run.lockfile import lock_entry
    from edgebuild.run.publish import check_publishable

    _lay_out(tmp_path)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    _judged(workspace, "clip", passed=False)
    clip = workspace.artifact("clip")
    assert verification_state(workspace, clip) is VerificationState.FAILED
    _edit(clip.directory / "report.json", edit)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    clip = workspace.artifact("clip")
    assert verification_state(workspace, clip) is VerificationState.NOT_VERIFIED
    state = status(workspace, clip)
    assert not state.verified and state.note == "not verified"
    (reason,) = state.reasons
    assert reason.startswith("build/clip/report.json is not taken as written: ") and said in reason, reason
    assert reason.endswith("`doit verify clip` judges it again")
    with pytest.raises(PublishError) as caught:
        check_publishable(workspace, [clip])
    assert "nothing is signed that verification did not write" in str(caught.value) and "\n  clip: " in str(caught.value)
    assert lock_entry(workspace, clip)["verified"] is None
    report = Project(tmp_path / "artifacts.yaml").report("clip")
    assert report is not None and not report.passed and [check.passed for check in report.checks] == [False]


def test_a_report_written_by_verification_is_sealed_and_counts(tmp_path: Path) -> None:
    from edgebuild.core.record import read_record

    _lay_out(tmp_path)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    _judged(workspace, "clip", passed=True)
    clip = workspace.artifact("clip")
    record = read_record(clip.directory)
    assert set(record.reports) == {"report.json", "report.md"} and record.unsealed_report(clip.directory) is None
    assert verification_state(workspace, clip) is VerificationState.VERIFIED
    # An edit of report.md alone (what a release shows a reader) is refused too.
    (clip.directory / "report.md").write_text("# clip: PASSED\n")
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    assert verification_state(workspace, workspace.artifact("clip")) is VerificationState.NOT_VERIFIED
    assert "report.md is not the file verification wrote" in status(workspace, workspace.artifact("clip")).reasons[0]


# --- a float model that ignores its input -------------------------------------------------


def test_spread_is_zero_for_a_model_that_ignores_its_input() -> None:
    rng = numpy.random.default_rng(0)
    varied = rng.normal(size=(6, 10))
    assert 0.9 < spread(varied) <= 1.0
    assert spread(numpy.repeat(varied[:1], 6, axis=0)) == pytest.approx(0.0, abs=1e-15)
    # A common offset dominates: the outputs barely move.
    assert spread(100.0 + 1e-4 * varied) < 1e-5
    # Outputs that vanish (a network whose activations died) read against the floor.
    tiny = 1e-22 * varied
    assert spread(tiny) > 0.9 and spread(tiny, 1e-10) < 1e-11
    assert spread(numpy.zeros((3, 4))) == 0.0


def test_a_degenerate_reference_fails_with_one_line() -> None:
    from edgebuild.run.chain import MIN_REFERENCE_SPREAD, _spread_checks

    rng = numpy.random.default_rng(1)
    healthy = numpy.stack([rng.normal(size=(1, 8)).astype("float32") for _ in range(3)])
    (passed,) = _spread_checks("vs_float", {"logits": healthy}, "the float model", "3 held-out images")
    assert passed.passed and passed.name == "vs_float.logits.reference_spread" and passed.limit == MIN_REFERENCE_SPREAD
    (same,) = _spread_checks("dataset", {"logits": numpy.stack([healthy[0]] * 3)}, "the float model", "26 images")
    assert not same.passed and "\n" not in same.detail
    assert same.detail.startswith("the float model gives nearly the same logits for each of 26 images: it ignores its "
                                  "input, and agreeing with it proves nothing")
    (dead,) = _spread_checks("vs_float", {"logits": 1e-25 * healthy}, "the float model", "3 inputs")
    assert not dead.passed and dead.detail.startswith("the float model's logits vanishes (at most 1.3")
    # One input says nothing of spread.
    assert _spread_checks("vs_float", {"logits": healthy[:1]}, "the float model", "1 input") == []


# --- names in gates, resolved at load -----------------------------------------------------


def _load(tmp_path: Path, manifest: str):
    (tmp_path / "artifacts.yaml").write_text(manifest)
    return load_manifest(tmp_path / "artifacts.yaml")


def test_a_misspelt_op_type_in_a_gate_is_refused_at_load(tmp_path: Path) -> None:
    gated = CLIP_TO_QDQ.replace("    outputs: [pooler_output]\n",
                                "    outputs: [pooler_output]\n"
                                "    verify: {coverage: {nnapi: {never_on_cpu: [Layernormalization]}}}\n", 1)
    with pytest.raises(ManifestError) as caught:
        _load(tmp_path, gated)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'artifacts.yaml'}:")
    assert ("nnapi: never_on_cpu names 'Layernormalization', which is none of the ONNX op types (did you mean "
            "'LayerNormalization'?)") in message
    # Spelled right (an ONNX op, or one of onnxruntime's own), it loads.
    for op_type in ("LayerNormalization", "QuickGelu"):
        _load(tmp_path, gated.replace("Layernormalization", op_type))


def test_vs_float_on_a_root_is_refused_at_load(tmp_path: Path) -> None:
    rooted = CLIP_TO_QDQ.replace("    outputs: [pooler_output]\n",
                                 "    outputs: [pooler_output]\n    verify: {vs_float: {cosine_min: 0.999}}\n", 1)
    with pytest.raises(ManifestError) as caught:
        _load(tmp_path, rooted)
    assert "artifacts -> clip -> verify -> vs_float: clip is made from no source" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_exact_conversion_takes_its_sources_limits_against_float(tmp_path: Path) -> None:
    from edgebuild.core.thresholds import OutputLimits
    from edgebuild.run.chain import _float_defaults

    manifest = CLIP_TO_QDQ + """\
  qdq_ort:
    kind: ort_format
    source: qdq
  clip_ort:
    kind: ort_format
    source: clip
"""
    _lay_out(tmp_path, manifest)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    qdq = _float_defaults(workspace.artifact("qdq"), "pooler_output")
    assert _float_defaults(workspace.artifact("qdq_ort"), "pooler_output") == qdq
    assert qdq.cosine_min < 0.99999
    # Of a float graph, the conversion's own tight limits.
    assert _float_defaults(workspace.artifact("clip_ort"), "pooler_output") == OutputLimits(cosine_min=0.99999,
                                                                                           max_rel=1e-4)
    # The QDQ graph's own vs_float, where the manifest sets one, is the conversion's too.
    _lay_out(tmp_path, manifest.replace("      images: [held_out/*.png]\n",
                                        "      images: [held_out/*.png]\n    verify: {vs_float: {cosine_min: 0.9}}\n"))
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    assert _float_defaults(workspace.artifact("qdq_ort"), "pooler_output").cosine_min == 0.9


# --- certificates as the tools count ------------------------------------------------------


def test_xnnpack_s_output_picks_are_not_fallbacks() -> None:
    from edgebuild.kinds.executorch.coverage import delegation_certificate

    info = {"delegate": "xnnpack", "delegated_nodes": 40, "not_delegated_nodes": 2, "delegated_subgraphs": 1,
            "fallback_nodes": [{"node": "getitem", "op_type": "getitem", "module": None},
                               {"node": "getitem_1", "op_type": "getitem", "module": None}]}
    certificate = delegation_certificate(info, "1.0")
    assert (certificate.nodes_taken, certificate.nodes_total, certificate.fraction) == (40, 40, 1.0)
    assert certificate.fallbacks == []
    # A real fallback stays one.
    info["not_delegated_nodes"] = 3
    info["fallback_nodes"].append({"node": "aten_native_layer_norm_default", "op_type": "aten_native_layer_norm_default",
                                   "module": "encoder.layers.0.layer_norm1"})
    certificate = delegation_certificate(info, "1.0")
    assert (certificate.nodes_total, [item["node"] for item in certificate.fallbacks]) == (
        41, ["aten_native_layer_norm_default"])


def _qdq_graph(path: Path, bits: int) -> Path:
    """A MatMul between a DequantizeLinear of 8- or 16-bit activations and a QuantizeLinear."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    quantized = {8: (TensorProto.UINT8, "uint8"), 16: (TensorProto.UINT16, "uint16")}[bits]
    weight = numpy_helper.from_array(numpy.ones((4, 4), "float32"), "w")
    scale = numpy_helper.from_array(numpy.array(0.1, "float32"), "s")
    zero = numpy_helper.from_array(numpy.array(0, quantized[1]), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_in"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_in"),
             helper.make_node("MatMul", ["xd", "w"], ["y"], name="matmul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weight, scale, zero])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    return path


def test_nnapi_runs_eight_bit_qdq_only_and_counts_as_the_checker_does(tmp_path: Path) -> None:
    import tempfile

    from onnxruntime.tools.mobile_helpers.usability_checker import check_nnapi_partitions
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

    from edgebuild.targets.onnx_graph import nnapi

    for bits in (8, 16):
        directory = tmp_path / f"a{bits}w8"
        directory.mkdir()
        _qdq_graph(directory / "model.onnx", bits)
        certificate = nnapi(directory, {})
        # The checker's own count: its optimize_model, then its table.
        with tempfile.TemporaryDirectory() as scratch:
            optimized = Path(scratch) / "model.onnx"
            optimize_model(directory / "model.onnx", optimized, use_external_initializers=True)
            checker = check_nnapi_partitions(ModelProtoWithShapeInfo(optimized).model_with_shape_info, True)
        assert certificate.nodes_total == checker.num_nodes and certificate.as_built["nodes_total"] == 3
        fallen = sorted(item["op_type"] for item in certificate.fallbacks)
        if bits == 8:
            assert certificate.nodes_taken == checker.num_supported_nodes and "QuantizeLinear" not in fallen
        else:
            # The checker's table says nothing of 16-bit values; NNAPI runs 8-bit QDQ only.
            assert certificate.nodes_taken == checker.num_supported_nodes - 2
            assert {"DequantizeLinear", "QuantizeLinear"} <= set(fallen)
        assert "8-bit" in certificate.assumption and "after onnxruntime's basic optimizations" in certificate.assumption


# --- held-out inputs of any model ---------------------------------------------------------


def test_held_out_tensors_files_of_every_format(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    from edgebuild.core.runner import TensorSpec
    from edgebuild.models.held_out import held_out_feeds
    from edgebuild.models.inputs import HeldOut

    specs = [TensorSpec("input_ids", (2, 8), "int64"), TensorSpec("attention_mask", (2, 8), "int64")]
    ids = numpy.arange(64).reshape(4, 2, 8)
    save_file({"input_ids": ids, "attention_mask": numpy.ones_like(ids)}, str(tmp_path / "a.safetensors"))
    numpy.savez(tmp_path / "b.npz", input_ids=ids.reshape(8, 8), attention_mask=numpy.ones((8, 8), "int64"))
    feeds, said = held_out_feeds(HeldOut(tensors=["*.safetensors", "*.npz"]), tmp_path, None, specs)
    assert len(feeds) == 8 and said == ["8 batches of held-out tensors"]
    assert feeds[0]["input_ids"].tolist() == ids[0].tolist() and feeds[0]["input_ids"].dtype == numpy.int64
    numpy.save(tmp_path / "c.npy", ids)
    with pytest.raises(CheckpointError, match=r"c\.npy: a \.npy file holds one array, and the model takes 2 inputs"):
        held_out_feeds(HeldOut(tensors=["c.npy"]), tmp_path, None, specs)
    feeds, _ = held_out_feeds(HeldOut(tensors=["c.npy"]), tmp_path, None, specs[:1])
    assert len(feeds) == 4 and feeds[0]["input_ids"].shape == (2, 8)
    numpy.savez(tmp_path / "d.npz", input_ids=ids)
    with pytest.raises(CheckpointError, match=r"d\.npz: no array 'attention_mask'"):
        held_out_feeds(HeldOut(tensors=["d.npz"]), tmp_path, None, specs)


TEXT = """\
checkpoints:
  bert: {fixture: distilbert_tiny}
artifacts:
  text:
    kind: hf_onnx
    checkpoint: bert
    model_class: DistilBertForSequenceClassification
    inputs: {input_ids: [2, 16], attention_mask: [2, 16]}
    outputs: [logits]
    held_out: {texts: [sentences.txt]}
"""


def test_held_out_texts_need_input_ids_at_load(tmp_path: Path) -> None:
    embeds = TEXT.replace("{input_ids: [2, 16], attention_mask: [2, 16]}", "{inputs_embeds: [1, 8, 64]}")
    with pytest.raises(ManifestError, match="held_out texts go through the checkpoint's tokenizer into an 'input_ids'"):
        _load(tmp_path, embeds)


@pytest.mark.slow
def test_a_text_model_is_judged_on_sentences_through_its_tokenizer(tmp_path: Path) -> None:
    """The issue's DistilBERT: its graph, and the ORT file made from it, judged on the
    user's sentences through the checkpoint's own tokenizer, not on random ids."""
    project = lay_out_project(tmp_path, TEXT + "  text_ort:\n    kind: ort_format\n    source: text\n")
    (tmp_path / "sentences.txt").write_text("the cat was fast.\na big red house\n\nthis is a good photo\n"
                                            "the dog was slow at night\na lone line\n")
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    root = json.loads((tmp_path / "build" / "text" / "report.json").read_text())
    assert root["metrics"]["inputs"] == "2 random inputs and 2 batches of held-out texts"
    assert root["judged_on"]["held_out"] == "2 batches of held-out texts" and not root["judged_on"]["random_only"]
    converted = json.loads((tmp_path / "build" / "text_ort" / "report.json").read_text())
    checks = {check["name"]: check for check in converted["checks"]}
    assert checks["logits.cosine"]["detail"].endswith("on 2 batches of held-out texts (of text) and 2 random inputs "
                                                      "(seed 0)")
    assert converted["metrics"]["vs_float"]["inputs"] == "2 batches of held-out texts (of text)"
    assert checks["vs_float.logits.reference_spread"]["passed"]
    # The tokenizer's files are the artifact's inputs: editing one judges it again.
    record = json.loads((tmp_path / "build" / "text" / ".edgebuild.json").read_text())
    assert any("tokenizer.json" in key for key in json.dumps(record["inputs"]).split('"')), record["inputs"]


@pytest.mark.slow
def test_a_model_that_ignores_its_input_fails_and_a_healthy_one_passes(tmp_path: Path) -> None:
    """The issue's MobileNetV2 at transformers' default initialisation: its logits are
    1e-25 for every photo, and a dataset gate judged against them passed with an interval
    of zero width. Initialised as a trained network's scale is, the same model passes."""
    import torch
    import transformers

    config = transformers.MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    torch.manual_seed(0)
    degenerate = transformers.MobileNetV2ForImageClassification(config)
    degenerate.save_pretrained(tmp_path / "dead")
    for module in degenerate.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
        elif isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=0.1)
    degenerate.save_pretrained(tmp_path / "alive")
    processor = transformers.MobileNetV2ImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64,
                                                                                                 "width": 64})
    for name in ("dead", "alive"):
        processor.save_pretrained(tmp_path / name)
    entry = """\
  {name}:
    kind: hf_onnx
    checkpoint: {name}
    model_class: MobileNetV2ForImageClassification
    inputs: {{pixel_values: [1, 3, 64, 64]}}
    outputs: [logits]
    verify:
      max_rel: 0.01
      dataset: {{images: [images/*.png, held_out/*.png], min_cosine: 0.99}}
"""
    project = lay_out_project(tmp_path, "checkpoints:\n  dead: {path: dead}\n  alive: {path: alive}\nartifacts:\n"
                              + entry.format(name="dead") + entry.format(name="alive"))
    verified = project.doit("verify")
    assert verified.returncode != 0
    dead = json.loads((tmp_path / "build" / "dead" / "report.json").read_text())
    failed = [check for check in dead["checks"] if not check["passed"]]
    # Whatever else fails on numbers of 1e-25 (here its own cosine), the one line says why.
    spread_check = next(check for check in failed if check["name"] == "dataset.logits.reference_spread")
    assert re.match(r"transformers .*MobileNetV2ForImageClassification.forward \(float32\)'s logits vanishes \(at "
                    r"most .* in magnitude\) on every one of images \(6 ", spread_check["detail"]), spread_check["detail"]
    assert "it ignores its input" in verified.stdout + verified.stderr
    alive = json.loads((tmp_path / "build" / "alive" / "report.json").read_text())
    assert alive["passed"], [check for check in alive["checks"] if not check["passed"]]
    spread_check = next(check for check in alive["checks"] if check["name"] == "dataset.logits.reference_spread")
    assert spread_check["value"] > 0.01


def test_a_report_judged_on_noise_alone_says_so_in_its_headline() -> None:
    from edgebuild.core.report import RANDOM_ONLY, Report

    checks = [Check.measure("cosine", 0.999, ">=", 0.99)]
    noise = Report("t", "k", "f" * 64, checks, extra={"judged_on": {"held_out": None, "dataset": None,
                                                                    "random_only": True}})
    assert noise.summary().splitlines()[2] == RANDOM_ONLY and "declare `held_out`" in RANDOM_ONLY
    data = Report("t", "k", "f" * 64, checks, extra={"judged_on": {"held_out": "2 batches of held-out images",
                                                                   "dataset": None, "random_only": False}})
    assert RANDOM_ONLY not in data.summary()
