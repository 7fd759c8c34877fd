"""The Qwen3.5 vision tower kind: geometry, strict loading, the fixed-shape wrapper."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgebuild.core.checkpoint import Checkpoint
from edgebuild.errors import CheckpointError, ParameterError
from edgebuild.models.qwen3_5.model import fixed_shape_tower_class, load_tower, sample_patches
from edgebuild.models.qwen3_5.geometry import tower_geometry

TINY_VISION = {"patch_size": 16, "spatial_merge_size": 2, "in_channels": 3, "temporal_patch_size": 2, "out_hidden_size": 96}


def test_geometry_at_448() -> None:
    geometry = tower_geometry(TINY_VISION, (448, 448))
    assert (geometry.grid_h, geometry.grid_w, geometry.patches) == (28, 28, 784)
    assert geometry.patch_dim == 3 * 2 * 16 * 16 == 1536
    assert geometry.merged_tokens == 196
    assert geometry.grid_thw == [1, 28, 28]


def test_rectangular_geometry() -> None:
    geometry = tower_geometry(TINY_VISION, (224, 448))
    assert (geometry.grid_h, geometry.grid_w, geometry.patches, geometry.merged_tokens) == (14, 28, 392, 98)


def test_indivisible_image_size_names_nearest_valid_sizes() -> None:
    with pytest.raises(ParameterError) as caught:
        tower_geometry(TINY_VISION, (448, 450))
    assert str(caught.value) == (
        "width 450 is not a multiple of patch_size x spatial_merge_size "
        "= 16 x 2 = 32; nearest valid sizes: 448, 480"
    )
    with pytest.raises(ParameterError, match="height 20 .* nearest valid sizes: 32$"):
        tower_geometry(TINY_VISION, (20, 32))


@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("image_size", [(448, 448), (224, 448)])
def test_wrapper_reproduces_model_forward(qwen_checkpoint: Path, dtype_name: str, image_size: tuple[int, int]) -> None:
    import torch

    checkpoint = Checkpoint(qwen_checkpoint)
    dtype = getattr(torch, dtype_name)
    tower = load_tower(checkpoint, dtype)
    geometry = tower_geometry(checkpoint.config_section("vision_config"), image_size)
    wrapper = fixed_shape_tower_class()(tower, geometry).eval()
    grid = torch.tensor([geometry.grid_thw])
    for patches in sample_patches(geometry, 2, seed=3):
        with torch.no_grad():
            wrapped = wrapper(patches.to(dtype))
            reference = tower(patches.to(dtype), grid).pooler_output
        assert wrapped.shape == (geometry.merged_tokens, geometry.out_hidden_size)
        assert torch.equal(wrapped, reference)
        # Not a vacuous equality: the output depends on the input.
        assert wrapped.float().std() > 0


@pytest.mark.parametrize("image_size", [(448, 448), (224, 448)])
def test_float16_module_cast_after_the_float32_check_is_the_float16_load(qwen_checkpoint: Path, image_size: tuple[int, int]) -> None:
    """The build checks the wrapper in float32, then casts: the module it exports must be
    the one loading in float16 gives, every weight and buffer in the same dtype, bit for
    bit (the rotary cos/sin staying float32), or the float32 check would prove nothing
    about it."""
    import torch

    from edgebuild.kinds.qwen3_5_tower.build import _cast_weights

    checkpoint = Checkpoint(qwen_checkpoint)
    geometry = tower_geometry(checkpoint.config_section("vision_config"), image_size)
    loaded = fixed_shape_tower_class()(load_tower(checkpoint, torch.float16), geometry)
    cast = fixed_shape_tower_class()(_cast_weights(load_tower(checkpoint, torch.float32), torch.float16), geometry)
    expected = dict(loaded.named_parameters()) | dict(loaded.named_buffers())
    found = dict(cast.named_parameters()) | dict(cast.named_buffers())
    assert found.keys() == expected.keys()
    assert [name for name in expected if found[name].dtype != expected[name].dtype] == []
    assert [name for name in expected if not torch.equal(found[name], expected[name])] == []
    assert found["rope_cos"].dtype == torch.float32 and found["pos_embeds"].dtype == torch.float16
    assert found["tower.blocks.0.attn.qkv.weight"].dtype == torch.float16


def test_rotary_frequencies_stay_float32(qwen_checkpoint: Path) -> None:
    import torch

    tower = load_tower(Checkpoint(qwen_checkpoint), torch.float16)
    assert tower.rotary_pos_emb.inv_freq.dtype == torch.float32
    assert tower.blocks[0].attn.qkv.weight.dtype == torch.float16


def _rewrite_shard_without(checkpoint_dir: Path, tensor: str) -> None:
    from safetensors.torch import load_file, save_file

    shard = checkpoint_dir / "model-00001-of-00002.safetensors"
    state = load_file(str(shard))
    del state[tensor]
    save_file(state, str(shard), metadata={"format": "pt"})


def test_strict_loading_refuses_a_missing_tensor(tmp_path: Path, qwen_checkpoint: Path) -> None:
    import torch

    copy = tmp_path / "copy"
    shutil.copytree(qwen_checkpoint, copy)
    (copy / "model.safetensors.index.json").unlink()
    _rewrite_shard_without(copy, "model.visual.blocks.1.mlp.linear_fc2.bias")
    with pytest.raises(CheckpointError) as caught:
        load_tower(Checkpoint(copy, label="checkpoint 'q'"), torch.float32)
    assert str(caught.value) == (
        "checkpoint 'q': the model.visual.* tensors do not match Qwen3_5VisionModel: "
        "missing 1 (blocks.1.mlp.linear_fc2.bias); unexpected none"
    )


def _tower_params(image_size: int = 64):
    from edgebuild.kinds.qwen3_5_tower.params import TowerParams

    return TowerParams(kind="qwen3_5_vision_tower", checkpoint="q", image_size=image_size)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("depth", "three", 'vision_config -> depth: expected an integer >= 1, found "three"'),
        ("patch_size", 0, "vision_config -> patch_size: expected an integer >= 1, found 0"),
        ("num_heads", 2.5, "vision_config -> num_heads: expected an integer >= 1, found 2.5"),
        ("spatial_merge_size", None, "vision_config -> spatial_merge_size: expected an integer >= 1, found null"),
    ],
)
def test_bad_vision_config_is_named_before_anything_loads(
    tmp_path: Path, qwen_checkpoint: Path, key: str, value: object, expected: str
) -> None:
    import json

    from edgebuild.core.registry import get_kind

    copy = tmp_path / "copy"
    shutil.copytree(qwen_checkpoint, copy)
    config = json.loads((copy / "config.json").read_text())
    config["vision_config"][key] = value
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as caught:
        get_kind("qwen3_5_vision_tower").check_parameters(_tower_params(), {"q": Checkpoint(copy)})
    assert str(caught.value) == f"{copy / 'config.json'}: {expected}"


def test_integer_tensor_where_the_tower_wants_floats(tmp_path: Path, qwen_checkpoint: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from edgebuild.core.registry import get_kind

    copy = tmp_path / "copy"
    shutil.copytree(qwen_checkpoint, copy)
    (copy / "model.safetensors.index.json").unlink()
    shard = copy / "model-00001-of-00002.safetensors"
    state = load_file(str(shard))
    name = "model.visual.blocks.0.norm1.weight"
    state[name] = state[name].to(torch.int32)
    save_file(state, str(shard), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as caught:
        get_kind("qwen3_5_vision_tower").check_parameters(_tower_params(), {"q": Checkpoint(copy)})
    assert str(caught.value).startswith(f"{shard}: tensor '{name}': expected a floating-point dtype (")
    assert str(caught.value).endswith("), found I32")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"vision_config": {"depth": -1}}, "fixture_config -> vision_config -> depth: expected an integer from 1 to 4096, found -1"),
        ({"vision_config": {"depth": 10**23}}, "fixture_config -> vision_config -> depth: expected an integer from 1 to 4096, found 100000000000000000000000"),
        ({"vision_config": {"hidden_size": "wide"}}, "fixture_config -> vision_config -> hidden_size: expected an integer from 1 to 4096, found 'wide'"),
        ({"vision_config": 3}, "fixture_config -> vision_config: expected a mapping, found 3"),
    ],
)
def test_fixture_config_out_of_range_is_a_manifest_error(tmp_path: Path, overrides: dict, expected: str) -> None:
    from edgebuild.errors import ManifestError
    from edgebuild.core.fixtures import ensure_fixture

    with pytest.raises(ManifestError) as caught:
        ensure_fixture(tmp_path, "qwen3_5_vl_tiny", overrides)
    assert str(caught.value) == expected
    assert not (tmp_path / "fixtures").exists()


# --- an FP8 release: the same tower ------------------------------------------------------------

FP8_MANIFEST = """\
checkpoints:
  plain:
    fixture: qwen3_5_vl_tiny
  fp8:
    fixture: qwen3_5_vl_tiny_fp8
artifacts:
  from_plain:
    kind: qwen3_5_vision_tower
    checkpoint: plain
    image_size: 64
  from_fp8:
    kind: qwen3_5_vision_tower
    checkpoint: fp8
    image_size: 64
"""


def test_the_fp8_release_has_the_plain_release_s_tower_fingerprint(tmp_path: Path) -> None:
    """The tower reads vision_config and model.visual.* only: float8 text weights, their
    scales and a quantization_config are no part of it."""
    from edgebuild.run.workspace import Workspace

    (tmp_path / "artifacts.yaml").write_text(FP8_MANIFEST)
    project = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    plain, fp8 = project.record(project.artifact("from_plain")), project.record(project.artifact("from_fp8"))
    assert fp8.fingerprint == plain.fingerprint
    assert fp8.inputs == plain.inputs
    assert "quantization_config" in project.checkpoint("fp8").config
    assert any(entry.dtype == "F8_E4M3" for entry in project.checkpoint("fp8").tensors.values())


@pytest.mark.slow
def test_the_tower_builds_from_the_fp8_release(verified_seed: Path, tmp_path: Path) -> None:
    """Built and verified from the FP8 fixture alone, in a project that never saw the plain
    one: the seed's fingerprint (the tower from the plain fixture) and its bytes."""
    from helpers import TOWER_MANIFEST, ProjectDir
    from edgebuild.core.record import read_record

    project = ProjectDir(tmp_path)
    project.manifest(TOWER_MANIFEST.replace("fixture: qwen3_5_vl_tiny", "fixture: qwen3_5_vl_tiny_fp8"))
    result = project.doit("verify", env={"EDGEBUILD_REMOTE_CACHE": "off"})
    assert result.returncode == 0, result.stdout + result.stderr
    built, seed = read_record(tmp_path / "build" / "t"), read_record(verified_seed / "build" / "t")
    assert built is not None and seed is not None
    assert built.fingerprint == seed.fingerprint
    for output in seed.outputs:
        assert (tmp_path / "build" / "t" / output).read_bytes() == (verified_seed / "build" / "t" / output).read_bytes(), output


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests, ONNX_CERTIFICATES

    common = [
        "edgebuild/kinds/qwen3_5_tower/params.py", "edgebuild/ml/onnx_tools.py",
        "edgebuild/models/qwen3_5/geometry.py", "edgebuild/models/qwen3_5/model.py",
    ]
    assert_code_digests(
        "qwen3_5_vision_tower",
        build=[*common,
               "edgebuild/kinds/qwen3_5_tower/build.py"],
        verify=[*common, *ONNX_CERTIFICATES,
                "edgebuild/kinds/qwen3_5_tower/verify.py", "edgebuild/models/qwen3_5/images.py"],
    )
