"""SigLIP checkpoints in every layout edgebuild reads: each is recognised by one
function from config.json and the tensor names, loads into the same encoder, and is
fingerprinted over exactly the tensors it hands out; anything else is one error.

The layouts are written by transformers itself where it still writes them
(SiglipModel and SiglipVisionModel ``save_pretrained``, whole and sharded)."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.core.checkpoint import Checkpoint
from edgebuild.errors import CheckpointError
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace
from edgebuild.models.siglip.model import (
    PREPROCESSOR_FILE,
    SIGLIP_LAYOUTS,
    VISION_PREFIX,
    encoder_outputs,
    load_vision_model,
    quiet_transformers,
    siglip_layout,
)

from helpers import REPO

SIGLIP_MODEL, BUILT_ARTIFACT, VISION_MODEL, VISION_MODEL_V4 = (
    SIGLIP_LAYOUTS[("vision_config", "vision_model.")],
    SIGLIP_LAYOUTS[("vision_config", "")],
    SIGLIP_LAYOUTS[(None, "")],
    SIGLIP_LAYOUTS[(None, "vision_model.")],
)
# Small enough that the tiny encoder's save is split over several shards and an index.
SHARD_SIZE = "300KB"


def _pixels() -> torch.Tensor:
    return torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1


def _with_preprocessor(directory: Path, checkpoint: Path) -> Path:
    shutil.copy(checkpoint / PREPROCESSOR_FILE, directory / PREPROCESSOR_FILE)
    return directory


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory, siglip_checkpoint: Path) -> dict[str, tuple[Path, object]]:
    """name -> (checkpoint directory, its expected layout), all holding siglip_tiny's encoder."""
    from transformers import SiglipModel

    root = tmp_path_factory.mktemp("layouts")
    found: dict[str, tuple[Path, object]] = {"siglip_model": (siglip_checkpoint, SIGLIP_MODEL)}
    with quiet_transformers():
        full = SiglipModel.from_pretrained(str(siglip_checkpoint), local_files_only=True)
        full.save_pretrained(str(root / "siglip_model_sharded"), max_shard_size=SHARD_SIZE)
        vision, _ = load_vision_model(Checkpoint(siglip_checkpoint))
        vision.save_pretrained(str(root / "vision_model"))
        vision.save_pretrained(str(root / "vision_model_sharded"), max_shard_size=SHARD_SIZE)
    found["siglip_model_sharded"] = (root / "siglip_model_sharded", SIGLIP_MODEL)
    found["vision_model"] = (root / "vision_model", VISION_MODEL)
    found["vision_model_sharded"] = (root / "vision_model_sharded", VISION_MODEL)

    # transformers 4 saved SiglipVisionModel with the prefix; 5 cannot write it any more.
    old = root / "vision_model_v4"
    shutil.copytree(root / "vision_model", old)
    state = load_file(str(old / "model.safetensors"))
    save_file({VISION_PREFIX + name: tensor for name, tensor in state.items()}, str(old / "model.safetensors"),
              metadata={"format": "pt"})
    found["vision_model_v4"] = (old, VISION_MODEL_V4)

    # What a siglip_f143 build writes: the checkpoint's config.json, SiglipVisionModel's
    # own tensor names, and the packed copy beside them (which is not the model).
    built = root / "built_artifact"
    built.mkdir()
    shutil.copy(siglip_checkpoint / "config.json", built / "config.json")
    save_file(state, str(built / "model.safetensors"), metadata={"format": "pt"})
    save_file({"encoder.layers.0.mlp.fc1.weight": torch.zeros(2, dtype=torch.uint8)}, str(built / "model.f143.safetensors"))
    found["built_artifact"] = (built, BUILT_ARTIFACT)
    for directory, _ in found.values():
        if not (directory / PREPROCESSOR_FILE).exists():
            _with_preprocessor(directory, siglip_checkpoint)
    return found


LAYOUT_NAMES = ["siglip_model", "siglip_model_sharded", "vision_model", "vision_model_sharded", "vision_model_v4",
                "built_artifact"]


@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_every_layout_loads_the_same_encoder(layouts: dict, siglip_checkpoint: Path, name: str) -> None:
    directory, expected = layouts[name]
    checkpoint = Checkpoint(directory)
    assert siglip_layout(checkpoint) == expected
    assert len(checkpoint.shard_files()) > 1 if name.endswith("_sharded") else len(checkpoint.shard_files()) == 1
    model, config = load_vision_model(checkpoint)
    reference, reference_config = load_vision_model(Checkpoint(siglip_checkpoint))
    # Every setting but how it was saved (the dtype save_pretrained records, the architecture).
    unrelated = {"architectures": None, "dtype": None}
    assert config.to_dict() | unrelated == reference_config.to_dict() | unrelated
    pixels = [_pixels()]
    assert torch.equal(encoder_outputs(model, pixels)[0], encoder_outputs(reference, pixels)[0])


@pytest.mark.parametrize("name", LAYOUT_NAMES)
def test_every_layout_is_fingerprinted_over_exactly_what_is_read(layouts: dict, tmp_path: Path, name: str) -> None:
    directory, layout = layouts[name]
    (tmp_path / "artifacts.yaml").write_text(textwrap.dedent(f"""\
        checkpoints:
          s:
            path: {directory}
        artifacts:
          q:
            kind: siglip_f143
            checkpoint: s
            calibration:
              images: ["{REPO / 'data' / 'calibration'}/*.png"]
        """))
    project = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    fingerprint = project.record(project.artifact("q")).inputs["checkpoint"]
    checkpoint = project.checkpoint("s")
    load_vision_model(checkpoint)
    assert checkpoint.tensors_read == set(fingerprint["tensors"])
    assert all(tensor.startswith(layout.prefix) for tensor in fingerprint["tensors"])
    assert not any(tensor.startswith("text_model.") for tensor in fingerprint["tensors"])
    assert fingerprint["config_key"] is None and set(fingerprint["files"]) == {PREPROCESSOR_FILE}


def test_the_vision_fixture_is_siglip_tiny_s_encoder(tmp_path: Path, siglip_checkpoint: Path) -> None:
    from edgebuild.core.fixtures import write_fixture

    directory = write_fixture(tmp_path / "vision", "siglip_vision_tiny")
    assert sorted(path.name for path in directory.iterdir()) == ["config.json", "model.safetensors", PREPROCESSOR_FILE]
    assert json.loads((directory / "config.json").read_text())["model_type"] == "siglip_vision_model"
    assert siglip_layout(Checkpoint(directory)) == VISION_MODEL
    vision = load_file(str(directory / "model.safetensors"))
    full = load_file(str(siglip_checkpoint / "model.safetensors"))
    assert vision.keys() == {name.removeprefix(VISION_PREFIX) for name in full if name.startswith(VISION_PREFIX)}
    assert all(torch.equal(tensor, full[VISION_PREFIX + name]) for name, tensor in vision.items())


# --- what is not a SigLIP encoder ------------------------------------------------------------

def test_a_config_of_another_model_is_one_error(tmp_path: Path, siglip_checkpoint: Path) -> None:
    directory = Path(shutil.copytree(siglip_checkpoint, tmp_path / "ckpt"))
    (directory / "config.json").write_text(json.dumps({"model_type": "clip_vision_model", "hidden_size": 96}))
    with pytest.raises(CheckpointError) as caught:
        siglip_layout(Checkpoint(directory))
    assert str(caught.value) == (
        f"{directory / 'config.json'}: not a SigLIP config: expected a 'vision_config' mapping (SiglipConfig) "
        "or model_type 'siglip_vision_model' (SiglipVisionConfig), found neither (model_type 'clip_vision_model')"
    )
    config = json.loads((siglip_checkpoint / "config.json").read_text()) | {"model_type": "clip"}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        siglip_layout(Checkpoint(directory))
    assert str(caught.value) == (
        f"{directory / 'config.json'}: model_type: expected 'siglip' beside a vision_config, found 'clip'"
    )


@pytest.mark.parametrize("tensors", ["neither", "both"])
def test_tensors_of_no_single_layout_are_one_error(tmp_path: Path, siglip_checkpoint: Path, tensors: str) -> None:
    directory = Path(shutil.copytree(siglip_checkpoint, tmp_path / "ckpt"))
    state = load_file(str(directory / "model.safetensors"))
    if tensors == "neither":
        state = {name: value for name, value in state.items() if not name.startswith(VISION_PREFIX)}
    else:
        state |= {name.removeprefix(VISION_PREFIX): value.clone() for name, value in state.items() if name.startswith(VISION_PREFIX)}
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError) as caught:
        siglip_layout(Checkpoint(directory, label="checkpoint 's'"))
    found = f"neither among {len(state)} tensors" if tensors == "neither" else "both"
    assert str(caught.value) == (
        "checkpoint 's': not a SigLIP vision encoder: expected a tensor named "
        f"vision_model.embeddings.patch_embedding.weight or embeddings.patch_embedding.weight, found {found} "
        "(in model.safetensors)"
    )


def test_a_bad_vision_setting_is_one_line(tmp_path: Path, layouts: dict) -> None:
    directory = Path(shutil.copytree(layouts["vision_model"][0], tmp_path / "ckpt"))
    config = json.loads((directory / "config.json").read_text()) | {"num_hidden_layers": "two"}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        load_vision_model(Checkpoint(directory))
    message = str(caught.value)
    assert message.startswith(f"{directory / 'config.json'}: (top level): not a SiglipVisionConfig (")
    assert "num_hidden_layers" in message and "\n" not in message


# --- a built artifact as the checkpoint of another -------------------------------------------

@pytest.mark.slow
def test_a_built_encoder_is_a_checkpoint_another_artifact_quantizes_and_exports(tmp_path: Path, siglip_checkpoint: Path) -> None:
    """The float encoder quantized by one project; its build directory the checkpoint of a
    second project, which quantizes it again (nearest: F143 weights stay put) and exports
    that to ONNX; everything verifies."""
    images = REPO / "data" / "calibration"
    first = tmp_path / "first"
    first.mkdir()
    (first / "artifacts.yaml").write_text(textwrap.dedent(f"""\
        checkpoints:
          s:
            path: {siglip_checkpoint}
        artifacts:
          q:
            kind: siglip_f143
            checkpoint: s
            calibration:
              images: ["{images}/*.png"]
            algorithm: nearest
        """))
    project = Workspace.open(first / "artifacts.yaml", first)
    make_current(project, project.artifact("q"), log=lambda message: None)
    built = first / "build" / "q"
    assert siglip_layout(Checkpoint(built)) == BUILT_ARTIFACT

    second = tmp_path / "second"
    second.mkdir()
    (second / "artifacts.yaml").write_text(textwrap.dedent(f"""\
        checkpoints:
          quantized:
            path: {built}
        artifacts:
          again:
            kind: siglip_f143
            checkpoint: quantized
            calibration:
              images: ["{images}/*.png"]
            algorithm: nearest
          graph:
            kind: siglip_f143_onnx
            source: again
        """))
    project = Workspace.open(second / "artifacts.yaml", second)
    assert set(project.record(project.artifact("again")).inputs["checkpoint"]["tensors"]) == set(load_file(str(built / "model.safetensors")))
    for name in project.manifest.order():
        make_current(project, project.artifact(name), log=lambda message: None)
        report = verify_artifact(project, project.artifact(name), log=lambda message: None)
        assert report.passed, name
    again = load_file(str(second / "build" / "again" / "model.safetensors"))
    original = load_file(str(built / "model.safetensors"))
    fc1 = "encoder.layers.0.mlp.fc1.weight"
    assert torch.equal(again[fc1], original[fc1])
