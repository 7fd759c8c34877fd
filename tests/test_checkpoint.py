"""Reading checkpoints by tensor, from the SafeTensors headers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgebuild.checkpoint import Checkpoint
from edgebuild.errors import CheckpointError


def test_select_locates_exact_byte_ranges(qwen_checkpoint: Path) -> None:
    import torch
    from safetensors import safe_open

    checkpoint = Checkpoint(qwen_checkpoint)
    entry = checkpoint.select(("model.visual.",))["model.visual.patch_embed.proj.weight"]
    with open(entry.file, "rb") as handle:
        handle.seek(entry.start)
        raw = handle.read(entry.nbytes)
    with safe_open(str(entry.file), framework="pt") as source:
        expected = source.get_tensor(entry.name)
    assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).reshape(entry.shape), expected)


def test_load_strips_prefix_and_casts(qwen_checkpoint: Path) -> None:
    import torch

    checkpoint = Checkpoint(qwen_checkpoint)
    entries = checkpoint.select(("model.visual.merger.",))
    state = checkpoint.load(entries, strip_prefix="model.visual.", dtype=torch.float32)
    assert sorted(state) == sorted(name.removeprefix("model.visual.") for name in entries)
    assert {tensor.dtype for tensor in state.values()} == {torch.float32}


def test_empty_selection_names_the_checkpoint(qwen_checkpoint: Path) -> None:
    checkpoint = Checkpoint(qwen_checkpoint, label="checkpoint 'q'")
    with pytest.raises(CheckpointError) as caught:
        checkpoint.select(("vision_model.",))
    assert str(caught.value) == (
        f"checkpoint 'q': no tensors named vision_model.* in {qwen_checkpoint} "
        f"({len(checkpoint.tensors)} tensors in model-00001-of-00002.safetensors, model-00002-of-00002.safetensors)"
    )


def test_missing_config_section(tmp_path: Path, qwen_checkpoint: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(qwen_checkpoint, copy)
    (copy / "config.json").write_text('{"model_type": "qwen3_5"}')
    with pytest.raises(CheckpointError) as caught:
        Checkpoint(copy).config_section("vision_config")
    assert str(caught.value) == (
        f"{copy / 'config.json'}: no 'vision_config' mapping; expected a checkpoint whose config has a vision_config"
    )


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a SafeTensors file \(header length \d+ bytes\)"):
        Checkpoint(tmp_path).tensors
