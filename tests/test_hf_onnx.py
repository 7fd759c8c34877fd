"""Kind ``hf_onnx``: any transformers class exported at fixed shapes with no code of its
own -- CLIP vision, DINOv2, wav2vec2 and SigLIP tiny checkpoints within 1e-4 of
transformers -- strictly loaded, its fingerprint covering what the class reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.errors import CheckpointError, ExportError, ManifestError, ParameterError
from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.run.workspace import Workspace

from helpers import REPO

QUIET = {"log": lambda message: None}
ENCODERS = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
  dino:
    fixture: dinov2_tiny
  w2v:
    fixture: wav2vec2_tiny
  siglip:
    fixture: siglip_vision_tiny
artifacts:
  clip_64:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output, last_hidden_state]
    held_out:
      images: [held_out/*.png]
  dino_64:
    kind: hf_onnx
    checkpoint: dino
    model_class: Dinov2Model
    inputs: {pixel_values: [2, 3, 64, 64]}
    outputs: [pooler_output]
  w2v_1600:
    kind: hf_onnx
    checkpoint: w2v
    model_class: Wav2Vec2Model
    inputs: {input_values: [1, 1600]}
  siglip_64:
    kind: hf_onnx
    checkpoint: siglip
    model_class: SiglipVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
"""


def _project(root: Path, manifest: str = ENCODERS) -> Workspace:
    shutil.copytree(REPO / "data" / "held_out", root / "held_out", dirs_exist_ok=True)
    (root / "artifacts.yaml").write_text(manifest)
    return Workspace.open(root / "artifacts.yaml", root)


def _error(tmp_path: Path, entry: str) -> str:
    (tmp_path / "artifacts.yaml").write_text(
        "checkpoints:\n  clip:\n    fixture: clip_vision_tiny\nartifacts:\n  a:\n    kind: hf_onnx\n    checkpoint: clip\n" + entry)
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    return str(caught.value).split(": artifacts -> a", 1)[1]


def test_parameters_are_checked_in_the_manifest(tmp_path: Path) -> None:
    base = "    model_class: CLIPVisionModel\n"
    assert _error(tmp_path, "    model_class: clip vision\n    inputs: {pixel_values: [1, 3, 64, 64]}\n") == (
        " -> model_class: expected a transformers class name such as 'CLIPVisionModel'; found 'clip vision'")
    assert _error(tmp_path, base + "    inputs: {pixel-values: [1, 3, 64, 64]}\n") == (
        " -> inputs: input name 'pixel-values' is not a forward() argument name")
    assert _error(tmp_path, base + "    inputs: {pixel_values: [1, 3, 65536, 65536]}\n") == (
        " -> inputs -> pixel_values -> shape: 12884901888 elements; at most 268435456 (2**28) per input")
    assert _error(tmp_path, base + "    inputs: {pixel_values: [0, 3]}\n") == (
        " -> inputs -> pixel_values -> shape -> 0: input should be greater than 0; found 0")
    assert _error(tmp_path, base + "    inputs: {input_values: [1, 1600]}\n    held_out:\n      images: [x.png]\n") == (
        ": held_out images go into a 'pixel_values' input of shape [batch, channels, height, width]")
    assert _error(tmp_path, base + "    inputs: {pixel_values: [1, 3, 64, 64]}\n    outputs: [a, a]\n") == (
        " -> outputs: each output at most once")


def test_the_fingerprint_covers_every_tensor_or_only_the_prefixes(tmp_path: Path) -> None:
    workspace = _project(tmp_path)
    record = workspace.record("clip_64")
    tensors = record.inputs["checkpoint"]["tensors"]
    checkpoint = workspace.checkpoint("clip")
    assert sorted(tensors) == sorted(checkpoint.tensors)
    assert set(record.inputs["checkpoint"]["files"]) == {"preprocessor_config.json"}
    assert record.inputs["checkpoint"]["config_key"] is None
    narrowed = _project(tmp_path, ENCODERS.replace("    outputs: [pooler_output, last_hidden_state]\n",
                                                    "    outputs: [pooler_output]\n    tensor_prefixes: [encoder.]\n"))
    assert sorted(narrowed.record("clip_64").inputs["checkpoint"]["tensors"]) == sorted(
        name for name in checkpoint.tensors if name.startswith("encoder."))


def test_a_class_transformers_lacks_is_a_parameter_error(tmp_path: Path) -> None:
    workspace = _project(tmp_path, ENCODERS.replace("model_class: CLIPVisionModel", "model_class: CLIPVisonModel"))
    with pytest.raises(ParameterError) as caught:
        workspace.fingerprint("clip_64")
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:14:5: artifacts -> clip_64 -> model_class: 'CLIPVisonModel' is not a class "
        "transformers provides (did you mean 'CLIPVisionModel'?)"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """Every encoder of ENCODERS built and verified, once for the module."""
    workspace = _project(tmp_path_factory.mktemp("encoders"))
    for artifact in workspace.order():
        make_current(workspace, artifact, **QUIET)
    return workspace


@pytest.mark.slow
@pytest.mark.parametrize(("name", "outputs"), [("clip_64", ["pooler_output", "last_hidden_state"]),
                                               ("dino_64", ["pooler_output"]), ("w2v_1600", ["last_hidden_state"]),
                                               ("siglip_64", ["pooler_output"])])
def test_encoders_export_within_1e4_of_transformers(built: Workspace, name: str, outputs: list[str]) -> None:
    report = verify_artifact(built, name, **QUIET)
    assert report.passed, report.summary()
    checks = {check.name: check for check in report.checks}
    for output in outputs:
        # Judged relative to the output's scale by default; the absolute error is measured all the same.
        assert checks[f"{output}.max_rel"].value <= 1e-4 and checks[f"{output}.max_rel"].limit == 1e-4
        assert f"{output}.max_abs" not in checks and report.metrics["outputs"][output]["max_abs"] <= 1e-4
        assert checks[f"{output}.cosine"].value >= 0.9999
    assert checks["allowzero_reshapes"].value == 0
    info = json.loads((built.artifact(name).directory / "export.json").read_text())
    assert [output["name"] for output in info["outputs"]] == outputs
    assert info["opset"] == 21 and info["model_class"] == built.artifact(name).params.model_class


@pytest.mark.slow
def test_held_out_images_go_through_the_checkpoints_processor(built: Workspace) -> None:
    report = verify_artifact(built, "clip_64", **QUIET)
    assert report.metrics["inputs"] == "2 random inputs and 2 batches of held-out images"


@pytest.mark.slow
def test_an_output_the_model_lacks_and_tensors_outside_the_prefixes_are_refused(tmp_path: Path) -> None:
    workspace = _project(tmp_path, ENCODERS.replace("outputs: [pooler_output, last_hidden_state]", "outputs: [logits]"))
    with pytest.raises(ExportError) as caught:
        make_current(workspace, "clip_64", **QUIET)
    assert str(caught.value) == "outputs: CLIPVisionModel returns no 'logits'; it returns last_hidden_state, pooler_output"
    workspace = _project(tmp_path, ENCODERS.replace("outputs: [pooler_output, last_hidden_state]",
                                                    "outputs: [pooler_output]\n    tensor_prefixes: [encoder.]"))
    with pytest.raises(ExportError) as caught:
        make_current(workspace, "clip_64", **QUIET)
    assert "CLIPVisionModel reads embeddings." in str(caught.value)
    assert str(caught.value).endswith("outside tensor_prefixes ['encoder.']: add its prefix, or the fingerprint would not cover it")
    assert not workspace.artifact("clip_64").directory.exists()


@pytest.mark.slow
def test_a_checkpoint_missing_a_tensor_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from edgebuild.core.fixtures import write_fixture

    checkpoint = write_fixture(tmp_path / "clip", "clip_vision_tiny")
    weights = load_file(str(checkpoint / "model.safetensors"))
    del weights["post_layernorm.bias"]
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    workspace = _project(tmp_path, ENCODERS.replace("    fixture: clip_vision_tiny", f"    path: {checkpoint}"))
    with pytest.raises(CheckpointError) as caught:
        make_current(workspace, "clip_64", **QUIET)
    assert str(caught.value) == f"checkpoint 'clip' ({checkpoint}): lacks tensors the class needs of CLIPVisionModel: post_layernorm.bias"


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = ["edgebuild/kinds/hf_onnx/model.py", "edgebuild/kinds/hf_onnx/params.py", "edgebuild/core/model_inputs.py",
              "edgebuild/ml/hf.py",
              "edgebuild/ml/images.py", "edgebuild/ml/onnx_tools.py"]
    assert_code_digests(
        "hf_onnx",
        build=[*common, "edgebuild/kinds/hf_onnx/build.py"],
        verify=[*common, "edgebuild/kinds/hf_onnx/verify.py"],
    )


DYNAMIC_BATCH = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
artifacts:
  clip_dyn:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs:
      pixel_values: {shape: [2, 3, 64, 64], dynamic: {0: [2, 8]}}
    outputs: [pooler_output]
"""


@pytest.mark.slow
def test_a_dynamic_batch_is_exported_symbolic_and_verified_at_both_ends(tmp_path: Path) -> None:
    """A batch axis declared dynamic: the graph's input has a symbolic batch, verification
    runs at the smallest and the largest batch, and a size between them, run by hand in
    onnxruntime, agrees with transformers."""
    import numpy
    import onnx
    import onnxruntime
    import torch
    import transformers

    workspace = _project(tmp_path, DYNAMIC_BATCH)
    make_current(workspace, "clip_dyn", **QUIET)
    report = verify_artifact(workspace, "clip_dyn", **QUIET)
    assert report.passed, report.summary()
    assert report.metrics["inputs"] == "4 random inputs at the smallest and at the largest dynamic sizes"
    directory = workspace.artifact("clip_dyn").directory
    graph = onnx.load(str(directory / "model.onnx"), load_external_data=False).graph
    batch = graph.input[0].type.tensor_type.shape.dim[0]
    assert not batch.HasField("dim_value") and batch.dim_param
    assert json.loads((directory / "export.json").read_text())["inputs"][0]["dynamic"] == {"0": [2, 8]}
    pixels = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    (produced,) = onnxruntime.InferenceSession(str(directory / "model.onnx")).run(None, {"pixel_values": pixels.numpy()})
    model = transformers.CLIPVisionModel.from_pretrained(workspace.checkpoint("clip").directory).eval()
    with torch.no_grad():
        expected = model(pixel_values=pixels).pooler_output.numpy()
    assert produced.shape == (5, expected.shape[1]) and numpy.abs(produced - expected).max() <= 1e-4
    # Fixed shapes are written as before: an artifact without `dynamic:` keeps its fingerprint.
    fixed = workspace.artifact("clip_dyn").params.model_copy(
        update={"inputs": {"pixel_values": workspace.artifact("clip_dyn").params.inputs["pixel_values"].model_copy(
            update={"dynamic": {}})}})
    assert fixed.build_parameters()["inputs"] == {"pixel_values": {"shape": [2, 3, 64, 64], "dtype": None}}
