"""The generated checkpoints are laid out like the real ones, deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild.core.checkpoint import Checkpoint, read_header
from edgebuild.core.fixtures import write_fixture


def test_qwen_fixture_layout(qwen_checkpoint: Path) -> None:
    config = json.loads((qwen_checkpoint / "config.json").read_text())
    assert config["model_type"] == "qwen3_5"
    assert config["vision_config"]["model_type"] == "qwen3_5_vision"
    index = json.loads((qwen_checkpoint / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    first, _ = read_header(qwen_checkpoint / shards[0])
    names = set(first) - {"__metadata__"}
    visual = {name for name in names if name.startswith("model.visual.")}
    # The tower shares its shard with lm_head and the embeddings, as in the real checkpoints.
    assert names - visual == {"lm_head.weight", "model.language_model.embed_tokens.weight"}
    assert {first[name]["dtype"] for name in visual} == {"BF16"}
    second, _ = read_header(qwen_checkpoint / shards[1])
    assert not any(name.startswith("model.visual.") for name in second)
    assert any(name.startswith("model.language_model.layers.") for name in second)
    assert set(index["weight_map"]) == names | (set(second) - {"__metadata__"})


def test_qwen_fixture_matches_the_transformers_tower(qwen_checkpoint: Path) -> None:
    from transformers.models.qwen3_5 import Qwen3_5VisionConfig, Qwen3_5VisionModel

    checkpoint = Checkpoint(qwen_checkpoint)
    tower = Qwen3_5VisionModel(Qwen3_5VisionConfig(**checkpoint.config_section("vision_config")))
    expected = {f"model.visual.{name}": tuple(tensor.shape) for name, tensor in tower.state_dict().items()}
    selected = checkpoint.select(("model.visual.",))
    assert {name: entry.shape for name, entry in selected.items()} == expected


def test_fixture_is_deterministic(tmp_path: Path, qwen_checkpoint: Path) -> None:
    again = write_fixture(tmp_path / "again", "qwen3_5_vl_tiny")
    for path in sorted(qwen_checkpoint.iterdir()):
        assert (again / path.name).read_bytes() == path.read_bytes(), path.name


def test_fixture_config_overrides(tmp_path: Path) -> None:
    directory = write_fixture(tmp_path / "deep", "qwen3_5_vl_tiny", {"vision_config": {"depth": 3}})
    checkpoint = Checkpoint(directory)
    assert checkpoint.config_section("vision_config")["depth"] == 3
    assert "model.visual.blocks.2.attn.qkv.weight" in checkpoint.select(("model.visual.",))


def test_siglip_fixture_layout(tmp_path: Path) -> None:
    directory = write_fixture(tmp_path / "siglip", "siglip_tiny")
    assert sorted(path.name for path in directory.iterdir()) == [
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
    ]
    header, _ = read_header(directory / "model.safetensors")
    assert any(name.startswith("vision_model.encoder.layers.") for name in header)
    assert any(name.startswith("text_model.") for name in header)
    assert json.loads((directory / "config.json").read_text())["model_type"] == "siglip"


def test_qwen_fp8_fixture_is_the_fp8_release_of_the_plain_one(tmp_path: Path, qwen_checkpoint: Path) -> None:
    """Text weights float8_e4m3fn with a float32 weight_scale_inv per 128x128 block, a
    quantization_config that leaves the tower (and lm_head) alone, and every visual
    tensor byte for byte the plain fixture's."""
    from safetensors.torch import load_file

    directory = write_fixture(tmp_path / "fp8", "qwen3_5_vl_tiny_fp8")
    plain, fp8 = Checkpoint(qwen_checkpoint), Checkpoint(directory)
    quantization = fp8.config["quantization_config"]
    assert (quantization["quant_method"], quantization["fmt"], quantization["weight_block_size"]) == ("fp8", "e4m3", [128, 128])
    visual_modules = {name.removesuffix(".weight") for name, entry in plain.tensors.items()
                      if name.startswith("model.visual.") and name.endswith(".weight") and len(entry.shape) >= 2}
    assert set(quantization["modules_to_not_convert"]) == visual_modules | {"lm_head"}
    assert {key: value for key, value in fp8.config.items() if key != "quantization_config"} == plain.config

    weight = "model.language_model.layers.0.mlp.gate_proj.weight"  # [192, 96]: two row blocks
    assert (fp8.tensors[weight].dtype, fp8.tensors[weight].shape) == ("F8_E4M3", (192, 96))
    assert (fp8.tensors[weight + "_scale_inv"].dtype, fp8.tensors[weight + "_scale_inv"].shape) == ("F32", (2, 1))
    tensors = load_file(str(fp8.tensors[weight].file))
    scales = tensors[weight + "_scale_inv"].repeat_interleave(128, dim=0)[:192]
    dequantized = tensors[weight].float() * scales
    original = load_file(str(plain.tensors[weight].file))[weight].float()
    # float8_e4m3fn keeps 3 mantissa bits: within half a step (1/16) of each block's scale x 448.
    assert (dequantized - original).abs().max() <= (scales * 448 / 16).max()
    assert tensors[weight].float().abs().max() == 448  # each block's largest magnitude maps to the largest value

    text_dtypes = {entry.dtype for name, entry in fp8.tensors.items()
                   if name.startswith("model.language_model.layers.") and not name.endswith("_scale_inv")}
    assert "F8_E4M3" in text_dtypes and "BF16" in text_dtypes  # norms, conv1d, A_log stay bf16
    for name, entry in plain.select(("model.visual.",)).items():
        twin = fp8.tensors[name]
        assert (twin.dtype, twin.shape) == (entry.dtype, entry.shape) == ("BF16", entry.shape)
        with open(entry.file, "rb") as first, open(twin.file, "rb") as second:
            first.seek(entry.start)
            second.seek(twin.start)
            assert first.read(entry.nbytes) == second.read(twin.nbytes), name


@pytest.mark.parametrize("arrange, found", [
    (lambda target, elsewhere: target.symlink_to(elsewhere), "a symbolic link to {elsewhere}; expected a new or empty "
     "directory to write the fixture into (never through a link)"),
    (lambda target, elsewhere: (target.mkdir(), (target / "config.json").symlink_to(elsewhere / "config.json")),
     "exists and is not an empty directory; expected a new or empty directory to write the fixture into"),
])
def test_the_fixture_command_never_writes_through_a_link(tmp_path: Path, arrange, found: str) -> None:
    import subprocess
    import sys

    target, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    elsewhere.mkdir()
    arrange(target, elsewhere)
    result = subprocess.run([sys.executable, "-m", "edgebuild", "fixture", "siglip_tiny", str(target)],
                            capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"edgebuild: error: {target}: {found.format(elsewhere=elsewhere)}\n"
    assert list(elsewhere.iterdir()) == []
