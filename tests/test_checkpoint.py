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


def _file_mappings() -> list[tuple[int, int, str]]:
    mappings = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) == 6:
            start, end = (int(value, 16) for value in fields[0].split("-"))
            mappings.append((start, end, fields[5]))
    return mappings


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
def test_owned_load_gives_memory_outside_the_file_mapping(qwen_checkpoint: Path) -> None:
    import torch

    checkpoint = Checkpoint(qwen_checkpoint)
    entries = checkpoint.select(("model.visual.",))
    mapped = checkpoint.load(entries)
    owned = checkpoint.load(entries, owned=True)
    assert sorted(owned) == sorted(mapped)
    assert all(torch.equal(owned[name], mapped[name]) for name in mapped)
    shards = {str(entry.file) for entry in entries.values()}

    def in_a_shard(tensor: torch.Tensor) -> bool:
        return any(start <= tensor.data_ptr() < end and path in shards for start, end, path in _file_mappings())

    # The default is a view of the file (what makes owned=True worth having) ...
    assert any(in_a_shard(tensor) for tensor in mapped.values())
    # ... owned tensors are not, also when a dtype cast already copied them.
    assert not any(in_a_shard(tensor) for tensor in owned.values())
    cast = checkpoint.load(entries, dtype=torch.float32, owned=True)
    assert not any(in_a_shard(tensor) for tensor in cast.values())


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
