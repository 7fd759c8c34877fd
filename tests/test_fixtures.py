"""The generated checkpoints are laid out like the real ones, deterministically."""

from __future__ import annotations

import json
from pathlib import Path

from edgebuild.checkpoint import Checkpoint, read_header
from edgebuild.fixtures import write_fixture


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
