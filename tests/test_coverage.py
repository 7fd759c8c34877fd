"""Coverage certificates (issue 38): which nodes each target takes, known before any
device runs the graph -- the seed's case (``Reshape`` nodes that keep ``allowzero=1``
send a graph to the CPU under DirectML) caught by a gate naming the nodes and the
modules they came from; certificates that agree with the tools run by hand; gates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from edgebuild.core.manifest import load_manifest
from edgebuild.core.registry import get_kind
from edgebuild.core.thresholds import CoverageSettings, coverage_context
from edgebuild.errors import ManifestError, VerificationFailed
from edgebuild.kinds.openvino.coverage import op_module
from edgebuild.kinds.qnn_context.coverage import placement_certificate
from edgebuild.ml import modules
from edgebuild.targets import onnx_graph
from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.run.coverage import judge_coverage
from edgebuild.run.workspace import Workspace

from helpers import REPO, skip_unless_present

QUIET = {"log": lambda message: None}
# Metadata as torch's ONNX exporter writes it, under edgebuild's wrapper of the model.
WRAPPER = "['edgebuild.models.hf.named_outputs_module.<locals>.Outputs', 'transformers.SomeModel', 'torch.nn.Linear']"


def _scopes(*modules: str) -> dict[str, str]:
    return {"pkg.torch.onnx.name_scopes": repr(["", "inner", *(f"inner.{module}" for module in modules), "view"]),
            "pkg.torch.onnx.class_hierarchy": WRAPPER}


def _seed_graph(allowzero: int, extra: list[onnx.NodeProto] = ()) -> onnx.ModelProto:
    """x -> Reshape(allowzero) -> Relu -> Reshape(allowzero) -> y, as the vision tower had it."""
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [4, 4])
    back = helper.make_tensor("back", TensorProto.INT64, [2], [2, 8])
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["a"], name="node_view", allowzero=allowzero),
        helper.make_node("Relu", ["a"], ["b"], name="node_relu"),
        helper.make_node("Reshape", ["b", "back"], ["y0"], name="node_view_1", allowzero=allowzero),
        *extra,
    ]
    for node, modules in zip(nodes, (("blocks.0.attn",), ("blocks.0.mlp",), ("blocks.1.attn", "blocks.1.attn.proj"))):
        for key, value in _scopes(*modules).items():
            node.metadata_props.add(key=key, value=value)
    last = nodes[-1].output[0]
    graph = helper.make_graph(nodes, "seed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)], [shape, back])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _hf_onnx_params(gates: str, checked: bool = True):
    """Real hf_onnx parameters with ``verify: {coverage: ...}`` as a manifest writes it (and,
    ``checked``, as the manifest's loader checks it: against the kind's targets)."""
    kind = get_kind("hf_onnx")
    return kind.Params.model_validate(
        {"kind": "hf_onnx", "checkpoint": "clip", "model_class": "CLIPVisionModel",
         "inputs": {"pixel_values": [1, 3, 64, 64]}, "verify": {"coverage": json.loads(gates)}},
        context=coverage_context(kind) if checked else None)


def _judge_graph(tmp_path: Path, model: onnx.ModelProto, gates: str, checked: bool = True):
    onnx.save(model, str(tmp_path / "model.onnx"))
    return judge_coverage(get_kind("hf_onnx"), _hf_onnx_params(gates, checked), tmp_path, **QUIET)


def test_the_seeds_reshapes_fail_a_directml_gate_naming_them_and_pass_once_sanitized(tmp_path: Path) -> None:
    gates = '{"directml": {"min_fraction": 1.0}}'
    kept = _judge_graph(tmp_path, _seed_graph(allowzero=1), gates)
    (check,) = kept.checks
    assert (check.name, check.passed, check.value) == ("coverage.directml.fraction", False, round(1 / 3, 6))
    assert "1 of 3 nodes on directml" in check.detail
    assert "node_view (Reshape, blocks.0.attn)" in check.detail
    assert "node_view_1 (Reshape, blocks.1.attn.proj)" in check.detail
    certificate = kept.certificates["directml"]
    assert certificate["fallbacks"] == [
        {"node": "node_view", "op_type": "Reshape", "module": "blocks.0.attn"},
        {"node": "node_view_1", "op_type": "Reshape", "module": "blocks.1.attn.proj"},
    ]
    assert (certificate["nodes_total"], certificate["nodes_taken"], certificate["partitions"]) == (3, 1, 1)
    # The kind's other default targets are certified too, with nothing gated on them.
    assert set(kept.certificates) == {"nnapi", "coreml", "directml"}

    sanitized = _judge_graph(tmp_path, _seed_graph(allowzero=0), gates)
    assert [(check.name, check.passed, check.value) for check in sanitized.checks] == [
        ("coverage.directml.fraction", True, 1.0)]
    assert sanitized.certificates["directml"]["fallbacks"] == []


def test_diff_and_the_report_page_show_a_certificate_old_to_new_by_module(tmp_path: Path) -> None:
    from edgebuild.cli.report_page.page import _coverage as page_coverage
    from edgebuild.run.diff import ArtifactDiff, Diff, _coverage, render

    def report(allowzero: int) -> dict:
        return {"coverage": _judge_graph(tmp_path, _seed_graph(allowzero), '{"targets": ["directml"]}').certificates}

    sanitized, kept = report(0), report(1)
    (change,) = _coverage(sanitized, kept)
    assert (change.target, change.before, change.after) == ("directml", (3, 3, 1), (1, 3, 1))
    assert change.fallen == (("blocks.0.attn", 1), ("blocks.1.attn.proj", 1)) and change.recovered == ()
    assert change.describe() == ("coverage directml: 3/3 → 1/3 nodes; now fall back: 1 node(s) of blocks.0.attn, "
                                 "1 node(s) of blocks.1.attn.proj")
    (back,) = _coverage(kept, sanitized)
    assert back.recovered == change.fallen and "no longer fall back" in back.describe()
    # The same certificate is no change; a report written before certificates is not compared.
    assert _coverage(kept, kept) == () and _coverage({"checks": []}, kept) == ()
    # An unchanged build whose certificate moved (its tool did) is not one of the quiet lines.
    lines = render(Diff("HEAD", None, (ArtifactDiff("clip", "hf_onnx", "unchanged", "a" * 64, "a" * 64,
                                                     coverage=(change,)),)))
    assert f"    {change.describe()}" in lines
    page = page_coverage(kept["coverage"], {"nnapi": "<no> graph"})
    assert "coverage: directml 1/3, nnapi not computed" in page and "&lt;no&gt; graph" in page
    assert "node_view (Reshape, blocks.0.attn)" in page


def test_partitions_and_ops_never_on_cpu_are_gated(tmp_path: Path) -> None:
    # A contrib op DirectML has no kernel for between two supported parts: two partitions.
    odd = helper.make_node("Relu", ["y0"], ["y"], name="node_relu_1")
    model = _seed_graph(allowzero=0, extra=[odd])
    model.graph.node[1].domain = "com.example"
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    result = _judge_graph(tmp_path, model, '{"directml": {"max_partitions": 1, "never_on_cpu": ["Relu", "MatMul"]}}')
    checks = {check.name: check for check in result.checks}
    assert checks["coverage.directml.partitions"].value == 2 and not checks["coverage.directml.partitions"].passed
    assert checks["coverage.directml.never_on_cpu"].value == 1
    assert "node_relu (Relu, blocks.0.mlp)" in checks["coverage.directml.never_on_cpu"].detail


def test_a_gate_on_a_target_the_kind_cannot_certify_is_a_manifest_error_naming_its_targets() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        _hf_onnx_params('{"qnn_htp": {"min_fraction": 1.0}}')
    assert ("unknown coverage target 'qnn_htp'; this artifact's kind can be certified for nnapi, coreml, directml"
            in str(caught.value))


def test_a_gate_on_a_target_without_a_certificate_fails_when_judged(tmp_path: Path) -> None:
    # Parameters made in Python, past the manifest's check: the gate is never silently dropped.
    result = _judge_graph(tmp_path, _seed_graph(allowzero=0), '{"qnn_htp": {"min_fraction": 1.0}}', checked=False)
    (check,) = result.checks
    assert (check.name, check.passed) == ("coverage.qnn_htp.certificate", False)
    assert check.detail == "a hf_onnx artifact has no certificate for 'qnn_htp' (its targets: nnapi, coreml, directml)"


def test_no_gate_records_certificates_and_fails_nothing(tmp_path: Path) -> None:
    result = _judge_graph(tmp_path, _seed_graph(allowzero=1), '{"targets": ["directml"]}')
    assert result.checks == [] and list(result.certificates) == ["directml"]


def test_a_directml_node_of_an_opset_without_a_dml_kernel_falls_back() -> None:
    # Reshape-21 is registered; an opset-25 graph's Reshape (version 25) has no DML kernel.
    model = _seed_graph(allowzero=0)
    model.opset_import[0].version = 25
    assert onnx_graph.directml_certificate(model).nodes_taken == 1


def test_gate_settings_are_checked_in_the_manifest(tmp_path: Path) -> None:
    for gates, message in (
        ("directml: {}", "coverage -> directml: expected at least one gate: min_fraction, max_partitions or never_on_cpu"),
        ("directml: {min_fraction: 1.5}", "coverage -> directml -> min_fraction: input should be less than or equal to 1"),
        ("targets: [webgpu]", "coverage: unknown coverage target 'webgpu'; this artifact's kind can be certified for "
                              "nnapi, coreml, directml"),
        ("nnapii: {min_fraction: 0.5}", "coverage: unknown coverage target 'nnapii' (did you mean 'nnapi'?)"),
    ):
        (tmp_path / "artifacts.yaml").write_text(
            "checkpoints:\n  clip: {fixture: clip_vision_tiny}\nartifacts:\n  a:\n    kind: hf_onnx\n    checkpoint: clip\n"
            "    model_class: CLIPVisionModel\n    inputs: {pixel_values: [1, 3, 64, 64]}\n"
            f"    verify:\n      coverage:\n        {gates}\n")
        with pytest.raises(ManifestError) as caught:
            load_manifest(tmp_path / "artifacts.yaml")
        assert str(caught.value).startswith(f"{tmp_path / 'artifacts.yaml'}:")
        assert message in str(caught.value) and "\n" not in str(caught.value)
    assert CoverageSettings(targets=["xnnpack"]).gates() == {}


def test_modules_come_from_the_exporters_metadata() -> None:
    assert modules.node_module(_scopes("encoder.layers.0.layer_norm1")) == "encoder.layers.0.layer_norm1"
    assert modules.node_module(_scopes()) is None   # the wrapper's own node: no module of the model
    plain = {"pkg.torch.onnx.name_scopes": "['', 'feature_extractor', 'feature_extractor.conv_layers.0.conv', 'conv']"}
    assert modules.node_module(plain) == "feature_extractor.conv_layers.0.conv"
    assert modules.node_module({}) is None


# A tiny CLIP encoder as a fixed-shape ONNX graph: the head of both manifests below.
CLIP_64 = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  clip_64:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
"""

CLIP = CLIP_64 + """\
  clip_64_program:
    kind: torch_export
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
  clip_64_ov:
    kind: openvino
    source: clip_64_program
  clip_64_pte:
    kind: executorch
    source: clip_64_program
"""


@pytest.fixture(scope="module")
def clip_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("coverage")
    shutil.copytree(REPO / "data" / "held_out", root / "held_out")
    (root / "artifacts.yaml").write_text(CLIP)
    return root


def _open(root: Path) -> Workspace:
    return Workspace.open(root / "artifacts.yaml", root)


@pytest.mark.slow
def test_an_exported_clip_carries_certificates_that_agree_with_the_usability_checker(clip_root: Path) -> None:
    import tempfile

    from onnxruntime.tools.mobile_helpers.usability_checker import check_coreml_partitions, check_nnapi_partitions
    from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

    clip_project = _open(clip_root)
    make_current(clip_project, clip_project.artifact("clip_64"), **QUIET)
    verify_artifact(clip_project, clip_project.artifact("clip_64"), **QUIET)
    report = json.loads((clip_root / "build" / "clip_64" / "report.json").read_text())
    certificates = report["coverage"]
    assert set(certificates) == {"nnapi", "coreml", "directml"}

    model = onnx.shape_inference.infer_shapes(
        onnx.load(str(clip_root / "build" / "clip_64" / "model.onnx"), load_external_data=False))
    # The checker counts the graph after onnxruntime's basic optimizations (analyze_model:
    # its optimize_model, then its tables), as a device's onnxruntime partitions it.
    with tempfile.TemporaryDirectory() as scratch:
        optimized_path = Path(scratch) / "model.onnx"
        optimize_model(clip_root / "build" / "clip_64" / "model.onnx", optimized_path, use_external_initializers=True)
        optimized = ModelProtoWithShapeInfo(optimized_path).model_with_shape_info
    for target, check in (("nnapi", lambda graph: check_nnapi_partitions(graph, True)),
                          ("coreml", lambda graph: check_coreml_partitions(graph, True,
                                                                           "coreml_supported_mlprogram_ops.md"))):
        found, info, built = certificates[target], check(optimized), check(model)
        assert (found["nodes_total"], found["nodes_taken"], found["partitions"]) == (
            info.num_nodes, info.num_supported_nodes, info.num_partitions), target
        assert len(found["fallbacks"]) == info.num_nodes - info.num_supported_nodes
        assert found["as_built"] == {"nodes_total": built.num_nodes, "nodes_taken": built.num_supported_nodes,
                                     "partitions": built.num_partitions}, target
    assert certificates["nnapi"]["nodes_total"] != len(model.graph.node)
    assert certificates["directml"]["nodes_total"] == len(model.graph.node)
    # Every node the exporter placed in a module of the model names it.
    nnapi = certificates["nnapi"]["fallbacks"]
    assert nnapi and all(entry["module"] for entry in nnapi if entry["op_type"] == "LayerNormalization")


@pytest.mark.slow
def test_status_names_the_certificate_whose_tool_moved_and_the_build_stays(clip_root: Path) -> None:
    from importlib.metadata import version

    from edgebuild.core.hashing import digest_json
    from edgebuild.run.state import status

    project = _open(clip_root)
    make_current(project, project.artifact("clip_64"), **QUIET)
    verify_artifact(project, project.artifact("clip_64"), **QUIET)
    now = version("onnxruntime")
    # The usability checker computes nnapi's and coreml's when judged; directml is edgebuild's table.
    assert project.coverage_tools(project.artifact("clip_64")) == {"nnapi": f"onnxruntime {now}", "coreml": f"onnxruntime {now}"}
    assert project.verify_parts(project.artifact("clip_64"))["coverage_tools"] == digest_json(project.coverage_tools(project.artifact("clip_64")))
    assert status(project, project.artifact("clip_64")).reasons == ()
    # The report as an older onnxruntime would have left it beside the same build.
    path = clip_root / "build" / "clip_64" / "report.json"
    report = json.loads(path.read_text())
    for target in ("nnapi", "coreml"):
        report["coverage"][target]["tool_version"] = "1.0.0"
    report["verify_parts"]["coverage_tools"] = digest_json({"nnapi": "onnxruntime 1.0.0", "coreml": "onnxruntime 1.0.0"})
    report["verify_fingerprint"] = "0" * 64
    path.write_text(json.dumps(report))
    state = _open(clip_root)
    said = status(state, state.artifact("clip_64"))
    assert said.state == "up to date" and said.fingerprint == project.fingerprint(project.artifact("clip_64"))
    assert [reason for reason in said.reasons if reason.startswith("coverage ")] == [
        f"coverage {target}: onnxruntime 1.0.0 -> {now} (its certificate is computed again; the build is not)"
        for target in ("nnapi", "coreml")]
    verify_artifact(state, state.artifact("clip_64"), **QUIET)
    assert json.loads(path.read_text())["coverage"]["nnapi"]["tool_version"] == now
    reopened = _open(clip_root)
    assert status(reopened, reopened.artifact("clip_64")).reasons == ()


@pytest.mark.slow
def test_a_gate_the_clip_graph_misses_fails_with_nodes_and_modules(clip_root: Path) -> None:
    clip = _open(clip_root)
    make_current(clip, clip.artifact("clip_64"), **QUIET)
    text = CLIP.replace("    outputs: [pooler_output]\n  clip_64_program:",
                        "    outputs: [pooler_output]\n    verify:\n      coverage:\n"
                        "        nnapi: {never_on_cpu: [LayerNormalization]}\n  clip_64_program:", 1)
    (clip_root / "artifacts.yaml").write_text(text)
    gated = _open(clip_root)
    try:
        with pytest.raises(VerificationFailed) as caught:
            verify_artifact(gated, gated.artifact("clip_64"), **QUIET)
    finally:
        (clip_root / "artifacts.yaml").write_text(CLIP)
    assert "coverage.nnapi.never_on_cpu" in str(caught.value)
    assert "(LayerNormalization, encoder.layers.0.layer_norm1)" in str(caught.value)


@pytest.mark.slow
def test_openvino_and_executorch_certificates_agree_with_the_tools_by_hand(clip_root: Path) -> None:
    skip_unless_present("openvino")
    skip_unless_present("executorch")
    import openvino
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import to_edge_transform_and_lower

    from edgebuild.targets.program import load_program

    clip_project = _open(clip_root)
    for name in clip_project.order([clip_project.artifact("clip_64_ov"), clip_project.artifact("clip_64_pte")]):
        make_current(clip_project, name, **QUIET)
        verify_artifact(clip_project, name, **QUIET)
    build = clip_root / "build"

    found = json.loads((build / "clip_64_ov" / "report.json").read_text())["coverage"]["openvino_cpu"]
    core = openvino.Core()
    model = core.read_model(str(build / "clip_64_ov" / "model.xml"))
    placed = core.query_model(model, "CPU")
    computing = [op for op in model.get_ops() if op.get_type_name() not in ("Parameter", "Result", "Constant")]
    assert found["nodes_total"] == len(computing)
    assert found["nodes_taken"] == sum(placed.get(op.get_friendly_name()) == "CPU" for op in computing)
    # A fallback op gets the module of the program node it was converted from, as the build
    # recorded them (the CPU plugin takes every op here: the mapping is checked op by op).
    modules = json.loads((build / "clip_64_ov" / "openvino.json").read_text())["modules"]
    assert modules["native_layer_norm_1"] == "encoder.layers.0.layer_norm1"
    mapped = {op.get_friendly_name(): op_module(op.get_friendly_name(), modules) for op in computing}
    assert mapped["native_layer_norm_1/aten.native_layer_norm.default/MVN"] == "encoder.layers.0.layer_norm1"
    assert sum(module is not None for module in mapped.values()) > len(computing) // 2

    found = json.loads((build / "clip_64_pte" / "report.json").read_text())["coverage"]["xnnpack"]
    program = load_program(build / "clip_64_program" / "program.pt2")
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    info = get_delegation_info(edge.exported_program().graph_module)
    # The tool counts the getitems that pick the delegate's outputs as not delegated; they
    # run nothing, and the certificate leaves them out (a fully delegated program reads 1.0).
    picks = info.delegation_by_operator["getitem"].non_delegated
    assert picks > 0
    assert (found["nodes_taken"], found["nodes_total"] - found["nodes_taken"], found["partitions"]) == (
        info.num_delegated_nodes, info.num_non_delegated_nodes - picks, info.num_delegated_subgraphs)
    assert len(found["fallbacks"]) == info.num_non_delegated_nodes - picks
    assert not any(fallback["op_type"] == "getitem" for fallback in found["fallbacks"])
    # Recorded at build time, node by node: the layer norms XNNPACK leaves out, by module.
    assert {"node": "aten_native_layer_norm_default_1", "op_type": "aten_native_layer_norm_default",
            "module": "encoder.layers.0.layer_norm1"} in found["fallbacks"]


def test_a_qnn_certificate_reads_the_placement_the_compile_recorded() -> None:
    # context.json as qnn_context's build writes it: the session's graph assignment.
    info = {"soc_model": 60, "htp_arch": 73, "nodes_on_qnn": 380, "nodes_elsewhere": 16, "onnxruntime_qnn": "2.7.0",
            "qnn_sdk": "2.40", "source_nodes": 396,
            "partitions": [{"provider": "QNNExecutionProvider", "nodes": 200, "ops": {"Conv": 200}},
                           {"provider": "CPUExecutionProvider", "nodes": 16, "ops": {"Gelu": 12, "Softmax": 4}},
                           {"provider": "QNNExecutionProvider", "nodes": 180, "ops": {"MatMul": 180}}]}
    found = placement_certificate(info)
    assert (found.nodes_total, found.nodes_taken, found.partitions) == (396, 380, 2)
    assert found.assumption.startswith("soc_model 60, HTP v73")
    assert [entry["op_type"] for entry in found.fallbacks].count("Gelu") == 12


QNN = CLIP_64 + """\
  clip_64_qdq:
    kind: onnx_qdq
    source: clip_64
    calibration: {images: [data/calibration/*.png]}
  clip_64_qnn_x:
    kind: qnn_context
    source: clip_64_qdq
"""


@pytest.mark.slow
def test_a_qnn_context_and_its_qdq_graph_carry_certificates_that_agree_with_the_tools(tmp_path: Path) -> None:
    skip_unless_present("qnn")
    import onnxruntime
    import onnxruntime_qnn
    from onnxruntime.tools.mobile_helpers.usability_checker import check_coreml_partitions

    shutil.copytree(REPO / "data" / "calibration", tmp_path / "data" / "calibration")
    (tmp_path / "artifacts.yaml").write_text(QNN)
    workspace = _open(tmp_path)
    for name in workspace.order([workspace.artifact("clip_64_qnn_x")]):
        make_current(workspace, name, **QUIET)
        verify_artifact(workspace, name, **QUIET)
    build = tmp_path / "build"

    # The QDQ graph: a quantizer's DequantizeLinear takes the module of the node it feeds.
    qdq = json.loads((build / "clip_64_qdq" / "report.json").read_text())["coverage"]
    model = onnx.shape_inference.infer_shapes(onnx.load(str(build / "clip_64_qdq" / "model.onnx"), load_external_data=False))
    info = check_coreml_partitions(model, True, "coreml_supported_mlprogram_ops.md")
    assert (qdq["coreml"]["nodes_taken"], qdq["coreml"]["partitions"]) == (info.num_supported_nodes, info.num_partitions)
    assert {"node": "inner.encoder.layers.0.layer_norm1.bias_DequantizeLinear", "op_type": "DequantizeLinear",
            "module": "encoder.layers.0.layer_norm1"} in qdq["coreml"]["fallbacks"]

    # The QNN provider asked by hand, CPU fallback allowed, at the same SoC and architecture.
    found = json.loads((build / "clip_64_qnn_x" / "report.json").read_text())["coverage"]["qnn_htp"]
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    devices = [device for device in onnxruntime.get_ep_devices() if device.ep_name == "QNNExecutionProvider"]
    options.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path(), "soc_model": "60",
                                               "htp_arch": "73", "offload_graph_io_quantization": "0"})
    session = onnxruntime.InferenceSession(str(build / "clip_64_qdq" / "model.onnx"), options)
    placed = session.get_provider_graph_assignment_info()
    on_qnn = [len(part.get_nodes()) for part in placed if part.ep_name == "QNNExecutionProvider"]
    assert (found["nodes_taken"], found["partitions"]) == (sum(on_qnn), len(on_qnn))
    assert found["nodes_total"] == sum(len(part.get_nodes()) for part in placed)
    assert found["assumption"].startswith("soc_model 60, HTP v73")


def test_a_gate_is_in_the_verification_fingerprint_and_not_the_build(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(CLIP)
    before = _open(tmp_path)
    (tmp_path / "artifacts.yaml").write_text(CLIP.replace(
        "    outputs: [pooler_output]\n  clip_64_program:",
        "    outputs: [pooler_output]\n    verify:\n      coverage:\n        directml: {min_fraction: 1.0}\n"
        "  clip_64_program:", 1))
    after = _open(tmp_path)
    assert before.fingerprint(before.artifact("clip_64")) == after.fingerprint(after.artifact("clip_64"))
    assert before.verify_fingerprint(before.artifact("clip_64")) != after.verify_fingerprint(after.artifact("clip_64"))


def test_the_directml_table_is_the_scripts_output_from_the_vendored_document() -> None:
    """The table is generated, never copied by hand: the module is what
    ``scripts/directml_kernels.py`` writes from onnxruntime's own kernel document."""
    import subprocess
    import sys

    checked = subprocess.run([sys.executable, str(REPO / "scripts" / "directml_kernels.py"), "--check"],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    from edgebuild.targets import directml_kernels

    # What the seed's graph needs of it, read from the document: Reshape at opsets 5 to 21
    # (a model at opset 21 has Reshape-21), the contrib attention kernels.
    assert directml_kernels.ONNX_KERNELS["Reshape"] == (5, 21)
    assert {"Attention", "MultiHeadAttention"} <= directml_kernels.MICROSOFT_KERNELS
    source = json.loads((REPO / "third_party" / "onnxruntime" / "SOURCE.json").read_text())
    assert directml_kernels.ONNXRUNTIME_COMMIT == source["commit"] and source["commit"][:12] in directml_kernels.SOURCE


def test_the_directml_table_stands_for_the_installed_onnxruntime() -> None:
    """An onnxruntime upgrade is a new kernel document: the table must come from the
    installed release's, or say why it is accepted for it (``SOURCE.json``). A failure here
    asks for ``scripts/directml_kernels.py`` to be run on the new release's section."""
    from importlib.metadata import version

    from edgebuild.targets import directml_kernels

    installed = ".".join(version("onnxruntime").split(".")[:2])
    stands_for = {directml_kernels.RELEASE, *directml_kernels.ACCEPTED_FOR} - {None}
    assert installed in stands_for, (
        f"the DirectML table is from onnxruntime {directml_kernels.ONNXRUNTIME} and accepted for "
        f"{', '.join(directml_kernels.ACCEPTED_FOR) or 'nothing else'}; onnxruntime {installed} is installed: vendor "
        "its DmlExecutionProvider section in third_party/onnxruntime/ and run scripts/directml_kernels.py")
