"""Kind ``onnx_qdq`` (and ``qnn_context`` on it): any float graph statically quantized,
calibrated on images through its checkpoint's own image processor; the CLIP graph
A16W8 stays at cosine >= 0.99 against the float graph on held-out images."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.errors import ManifestError, ParameterError
from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.run.workspace import Workspace

from helpers import REPO, pretend_built, skip_unless_present, verify_along

QUIET = {"log": lambda message: None}
CHAIN = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
artifacts:
  clip:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output, last_hidden_state]
  qdq:
    kind: onnx_qdq
    source: clip
    calibration:
      images: [images/*.png]
    held_out:
      images: [held_out/*.png]
  npu:
    kind: qnn_context
    source: qdq
"""


def _project(root: Path, manifest: str = CHAIN) -> Workspace:
    shutil.copytree(REPO / "data" / "calibration", root / "images", dirs_exist_ok=True)
    shutil.copytree(REPO / "data" / "held_out", root / "held_out", dirs_exist_ok=True)
    (root / "artifacts.yaml").write_text(manifest)
    return Workspace.open(root / "artifacts.yaml", root)


def test_parameters_are_checked_before_anything_is_built(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(CHAIN.replace("    source: clip\n", "    source: clip\n    activation_type: int8\n"))
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    assert str(caught.value).endswith("artifacts -> qdq: the qnn recipe quantizes activations to uint16 or uint8, not int8")
    workspace = _project(tmp_path, CHAIN.replace("    outputs: [pooler_output, last_hidden_state]\n",
                                                 "    outputs: [pooler_output]\n    dtype: fp16\n"))
    with pytest.raises(ParameterError, match="source 'clip' is a float16 graph; expected a float32 one"):
        workspace.fingerprint(workspace.artifact("qdq"))
    workspace = _project(tmp_path, CHAIN.replace("{pixel_values: [1, 3, 64, 64]}", "{pixel_values: [1, 4096]}"))
    with pytest.raises(ParameterError) as caught:
        workspace.fingerprint(workspace.artifact("qdq"))
    assert str(caught.value).endswith(
        "artifacts -> qdq -> calibration: images need a pixel_values input of shape [batch, channels, height, width], "
        "and source 'clip' takes pixel_values")


def test_the_fingerprint_holds_the_graphs_bytes_and_the_image_processor(tmp_path: Path) -> None:
    workspace = _project(tmp_path)
    graph = pretend_built(workspace, "clip")
    record = workspace.record(workspace.artifact("qdq"))
    assert record.inputs["source"] == {"outputs": graph}
    assert record.inputs["checkpoint"]["tensors"] == {}
    assert set(record.inputs["checkpoint"]["files"]) == {"preprocessor_config.json"}
    assert len(record.inputs["files:calibration.images"]) == 4
    # Held-out images only decide the verdict.
    assert "files:held_out.images" not in record.inputs


@pytest.mark.slow
def test_the_clip_graph_quantizes_and_compiles(tmp_path: Path) -> None:
    workspace = _project(tmp_path)
    for name in ("clip", "qdq"):
        make_current(workspace, workspace.artifact(name), **QUIET)
    report = verify_along(workspace, "qdq", **QUIET)
    assert report.passed, report.summary()
    checks = {check.name: check for check in report.checks}
    assert checks["pooler_output.cosine"].value >= 0.99 and checks["last_hidden_state.cosine"].value >= 0.99
    assert checks["activation_types"].value == ["uint16"] and checks["weight_types"].value == ["uint8"]
    assert checks["quantized_weights"].value == 19 and checks["unquantized_weights"].value == 0
    assert report.metrics["reference"] == "onnxruntime CPU, QDQ graph vs the float graph, 2 held_out inputs"
    skip_unless_present("qnn")
    make_current(workspace, workspace.artifact("npu"), **QUIET)
    compiled = verify_artifact(workspace, workspace.artifact("npu"), **QUIET)
    assert compiled.passed, compiled.summary()
    assert {check.name: check.value for check in compiled.checks}["nodes_off_qnn"] == 0


@pytest.mark.slow
def test_the_generic_recipe_and_tensors_files(tmp_path: Path) -> None:
    import numpy
    from safetensors.numpy import save_file

    pixels = numpy.random.default_rng(0).normal(0, 1, (3, 3, 64, 64)).astype(numpy.float32)
    save_file({"pixel_values": pixels}, str(tmp_path / "pixels.safetensors"))
    # Calibrated and judged on the same kind of inputs: normal noise, three samples.
    workspace = _project(tmp_path, CHAIN.replace("      images: [images/*.png]\n", "      tensors: [pixels.safetensors]\n")
                         .replace("      images: [held_out/*.png]\n", "      tensors: [pixels.safetensors]\n")
                         .replace("    source: clip\n", "    source: clip\n    recipe: generic\n    activation_type: int8\n"
                                  "    weight_type: int8\n"))
    for name in ("clip", "qdq"):
        make_current(workspace, workspace.artifact(name), **QUIET)
    report = verify_along(workspace, "qdq", **QUIET)
    assert report.passed, report.summary()
    checks = {check.name: check.value for check in report.checks}
    assert checks["activation_types"] == ["int8"] and checks["weight_types"] == ["int8"]


def _tiny_graph() -> "object":
    """x @ (weight * scale) + bias, ``scale`` a Constant node's 6 KiB tensor (an attribute
    tensor, which onnxruntime's quantizer also moves to external data)."""
    import numpy
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(numpy.arange(32 * 48, dtype=numpy.float32).reshape(32, 48), "weight")
    bias = numpy_helper.from_array(numpy.ones(48, dtype=numpy.float32), "bias")
    scale = numpy_helper.from_array(numpy.full((32, 48), 0.5, dtype=numpy.float32), "scale")
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["scale"], value=scale),
         helper.make_node("Mul", ["weight", "scale"], ["scaled"]),
         helper.make_node("MatMul", ["x", "scaled"], ["product"]), helper.make_node("Add", ["product", "bias"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 48])], [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_graphs_save_and_move_beside_a_data_file_of_their_name_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx checks for the data file's name in the working directory: a project holding a
    model.onnx.data of its own where doit runs still builds, and the bytes are onnx's --
    as ``onnx.save`` writes them, and, for a graph moved to its name, as onnxruntime's
    quantizer saves (``convert_attribute=True``: the Constant's tensor too)."""
    import onnx

    from edgebuild.ml.onnx_tools import relocate_external_data, save_with_external_data

    directories = {name: tmp_path / name for name in ("clean", "clean_attributes", "saved", "moved")}
    for directory in directories.values():
        directory.mkdir()

    def save(directory: str, name: str, convert_attribute: bool) -> None:
        onnx.save(_tiny_graph(), str(directories[directory] / name), save_as_external_data=True,
                  all_tensors_to_one_file=True, location=name + ".data", size_threshold=1024,
                  convert_attribute=convert_attribute)

    save("clean", "model.onnx", False)
    save("clean_attributes", "model.onnx", True)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx.data").write_bytes(b"the project's own")
    with pytest.raises(FileExistsError):  # what onnx itself does here
        onnx.save(_tiny_graph(), str(directories["saved"] / "model.onnx"), save_as_external_data=True,
                  location="model.onnx.data")
    save_with_external_data(_tiny_graph(), directories["saved"] / "model.onnx")
    save("moved", "other.onnx", True)
    relocate_external_data(directories["moved"] / "other.onnx", directories["moved"] / "model.onnx")
    for written, clean in (("saved", "clean"), ("moved", "clean_attributes")):
        expected = {name: (directories[clean] / name).read_bytes() for name in ("model.onnx", "model.onnx.data")}
        assert sorted(path.name for path in directories[written].iterdir()) == sorted(expected)
        assert {name: (directories[written] / name).read_bytes() for name in expected} == expected, written
    moved = onnx.load(str(directories["moved"] / "model.onnx"), load_external_data=False)
    assert moved.graph.node[0].attribute[0].t.data_location == onnx.TensorProto.EXTERNAL
    assert (tmp_path / "model.onnx.data").read_bytes() == b"the project's own"


@pytest.mark.slow
def test_a_graph_quantizes_where_the_working_directory_holds_model_onnx_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workspace = _project(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx.data").write_bytes(b"the project's own")
    for name in ("clip", "qdq"):
        make_current(workspace, workspace.artifact(name), **QUIET)
    assert verify_along(workspace, "qdq", **QUIET).passed
    assert (tmp_path / "model.onnx.data").read_bytes() == b"the project's own"


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests, ONNX_CERTIFICATES

    common = [
        "edgebuild/kinds/onnx_qdq/params.py", "edgebuild/ml/onnx_tools.py", "edgebuild/ml/qdq.py",
        "edgebuild/ml/qdq_graph.py", "edgebuild/models/graph_inputs.py", "edgebuild/models/hf.py",
    ]
    assert_code_digests(
        "onnx_qdq",
        build=[*common,
               "edgebuild/core/inputs.py", "edgebuild/core/runner.py", "edgebuild/kinds/onnx_qdq/build.py",
               "edgebuild/ml/images.py", "edgebuild/targets/formats.py"],
        verify=[*common, *ONNX_CERTIFICATES,
                "edgebuild/kinds/onnx_qdq/verify.py", "edgebuild/ml/qdq_checks.py"],
    )
