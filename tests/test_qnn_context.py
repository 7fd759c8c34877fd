"""The qnn_context kind: the tiny QDQ tower compiled for Snapdragon X by onnxruntime's
QNN provider (HTP backend, CPU fallback disabled), and the HTP simulator's output
against the QDQ graph on the CPU."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgebuild.run.builder import make_current
from edgebuild.core.hashing import file_digest
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace

from helpers import REPO, needs, pretend_built, verify_along

QUIET = {"log": lambda message: None}

MANIFEST = """\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
  tower:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
  qdq:
    kind: qwen3_5_tower_qdq
    source: tower
    calibration:
      images: [images/*.png]
  npu:
    kind: qnn_context
    source: qdq
"""


needs_qnn = needs("qnn")


def test_the_qnn_sdk_version_is_in_this_kind_only(tmp_path: Path) -> None:
    shutil.copytree(REPO / "data" / "calibration", tmp_path / "images")
    (tmp_path / "artifacts.yaml").write_text(MANIFEST)
    project = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    pretend_built(project, "tower")
    pretend_built(project, "qdq")
    assert "onnxruntime-qnn" in project.record(project.artifact("npu")).versions
    assert "onnxruntime-qnn" not in project.record(project.artifact("qdq")).versions
    assert project.record(project.artifact("npu")).params == {"kind": "qnn_context", "soc_model": 60, "htp_arch": 73}


@pytest.mark.slow
@needs_qnn
def test_context_compiles_whole_and_simulates_like_the_cpu(tmp_path_factory: pytest.TempPathFactory) -> None:
    digests = []
    for attempt in ("first", "second"):
        root = tmp_path_factory.mktemp(attempt)
        shutil.copytree(REPO / "data" / "calibration", root / "images")
        (root / "artifacts.yaml").write_text(MANIFEST)
        project = Workspace.open(root / "artifacts.yaml", root)
        for name in ("tower", "qdq", "npu"):
            make_current(project, project.artifact(name), **QUIET)
        built = root / "build" / "npu"
        digests.append({name: file_digest(built / name) for name in ("model.onnx", "model_qnn.bin", "context.json")})
    # Compiled twice, in two directories: the same bytes.
    assert digests[0] == digests[1]

    report = verify_along(project, "npu", **QUIET)
    assert report.passed, report.summary()
    checks = {check.name: check for check in report.checks}
    assert checks["nodes_off_qnn"].value == 0
    assert checks["qnn_partitions"].value == 1
    assert checks["context_graph_nodes"].value == ["EPContext"]
    assert checks["simulator.cosine"].value > 0.9995
    assert 0 < checks["simulator.max_abs"].value < 0.1
    info = json.loads((built / "context.json").read_text())
    assert (info["soc_model"], info["htp_arch"]) == (60, 73)
    assert info["partitions"][0]["provider"] == "QNNExecutionProvider"
    assert info["partitions"][0]["ops"]["Gemm"] == 10
    assert info["source_nodes"] < info["nodes_on_qnn"]


@pytest.mark.slow
@needs_qnn
def test_simulation_is_skipped_above_the_threshold(tmp_path: Path) -> None:
    shutil.copytree(REPO / "data" / "calibration", tmp_path / "images")
    (tmp_path / "artifacts.yaml").write_text(MANIFEST + "    verify:\n      simulate_max_weight_mib: 0.1\n")
    project = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    for name in ("tower", "qdq", "npu"):
        make_current(project, project.artifact(name), **QUIET)
    report = verify_along(project, "npu", **QUIET)
    assert report.passed
    assert not any(check.name.startswith("simulator.") for check in report.checks)
    assert report.metrics["simulator"].startswith("skipped: the source's weights are 0.2 MiB, over verify.simulate_max_weight_mib = 0.1")


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = [
        "edgebuild/kinds/qnn_context/params.py", "edgebuild/kinds/qnn_context/qnn.py",
        "edgebuild/targets/formats.py",
    ]
    assert_code_digests(
        "qnn_context",
        build=[*common,
               "edgebuild/kinds/qnn_context/build.py", "edgebuild/kinds/qnn_context/compile.py",
               "edgebuild/ml/modules.py"],
        verify=[*common,
                "edgebuild/kinds/qnn_context/coverage.py", "edgebuild/kinds/qnn_context/verify.py",
                "edgebuild/ml/onnx_tools.py"],
    )


@needs_qnn
def test_a_compile_the_backend_refuses_names_the_nodes_and_their_modules(tmp_path: Path) -> None:
    """The new user's case (onnxruntime's text named ``node_Conv_206`` and nothing else):
    the compile child asks a session that lets the CPU take what QNN does not where each
    node went, and the refusal names them with the modules the exporter recorded."""
    import subprocess
    import sys

    import onnx
    from onnx import TensorProto, helper

    from edgebuild.kinds.qnn_context.build import _rejection
    from edgebuild.kinds.qnn_context.params import QnnParams

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="node_relu"),
             helper.make_node("Det", ["a"], ["y"], name="node_Det_206")]
    # Name scopes as torch's exporter writes them: each enclosing module's path, then the op.
    for node, scopes in zip(nodes, (["", "encoder", "encoder.act", "relu"], ["", "encoder", "encoder.head", "det"])):
        node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(scopes))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    source = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    child = subprocess.run([sys.executable, "-m", "edgebuild.kinds.qnn_context.compile", str(source),
                            str(tmp_path / "out.onnx"), "60", "73"], capture_output=True, text=True, timeout=300)
    assert child.returncode == 1
    failure = json.loads(child.stdout.strip().splitlines()[-1])
    assert failure["refused"] == [{"node": "node_Det_206", "op_type": "Det"}]
    assert "fallback" in failure["error"]
    params = QnnParams.model_validate({"kind": "qnn_context", "source": "qdq"})
    said = _rejection(source, params, failure["error"], failure["refused"])
    assert ("the HTP backend (soc_model 60, htp_arch 73) does not take 1 node(s): node_Det_206 (Det, encoder.head)"
            in said), said
    assert "Hint: the backend has no kernel here for Det" in said
