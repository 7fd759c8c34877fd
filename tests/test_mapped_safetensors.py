"""``model.safetensors`` laid out first and filled through a mapping
(``edgebuild/ml/mapped_safetensors.py``): the same bytes as ``save_file`` (with the
sorted header, or with the metadata in sorted order), whatever the dtypes, shapes and
names; placed weights are the file's own pages."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgebuild.kinds.siglip_f143.packed import sort_metadata
from edgebuild.ml.mapped_safetensors import MappedSafetensors

METADATA = {"format": "pt", "ipu_f143_reconstruction": "gptq", "edgebuild_fingerprint": "ab" * 32}


def mixed_state() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return {
        "encoder.layers.0.mlp.fc1.weight": torch.randn(43, 16, generator=generator),
        "encoder.layers.0.mlp.fc1.bias": torch.randn(43, generator=generator),
        "embeddings.position_embedding.weight": torch.randn(5, 16, generator=generator).to(torch.float16),
        "head.probe": torch.randn(1, 1, 16, generator=generator).to(torch.bfloat16),
        "b.codes": torch.randint(-100, 100, (7, 3), generator=generator, dtype=torch.int8),
        "a.scalar": torch.tensor(2.5, dtype=torch.float64),
        "z.exponent": torch.randint(-8, 8, (3,), generator=generator, dtype=torch.int8),
        "empty": torch.zeros(0, 4),
    }


def header(path: Path) -> tuple[bytes, dict]:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    return data[8 : 8 + length], json.loads(data[8 : 8 + length])


def test_sorted_it_is_byte_for_byte_what_save_file_and_sort_metadata_write(tmp_path: Path) -> None:
    state = mixed_state()
    save_file(state, str(tmp_path / "expected.safetensors"), metadata=METADATA)
    sort_metadata(tmp_path / "expected.safetensors")
    mapped = MappedSafetensors.create(tmp_path / "mapped.safetensors", state, METADATA, sort=True)
    assert mapped is not None
    mapped.write(state)
    assert (tmp_path / "mapped.safetensors").read_bytes() == (tmp_path / "expected.safetensors").read_bytes()


def test_unsorted_it_is_save_file_s_with_the_metadata_keys_in_order(tmp_path: Path) -> None:
    """save_file writes the metadata in a hash map's order (it varies between processes):
    the mapped file has one of those orders, the sorted one, and every other byte the same."""
    state = mixed_state()
    save_file(state, str(tmp_path / "expected.safetensors"), metadata=METADATA)
    mapped = MappedSafetensors.create(tmp_path / "mapped.safetensors", state, METADATA, sort=False)
    assert mapped is not None
    mapped.write(state)
    expected_raw, expected = header(tmp_path / "expected.safetensors")
    ours_raw, ours = header(tmp_path / "mapped.safetensors")
    assert list(ours.pop("__metadata__")) == sorted(METADATA)
    assert expected.pop("__metadata__") == METADATA
    assert list(ours) == list(expected) and ours == expected  # tensor entries in save_file's order
    assert len(ours_raw) == len(expected_raw)
    expected_data = (tmp_path / "expected.safetensors").read_bytes()[8 + len(expected_raw):]
    assert (tmp_path / "mapped.safetensors").read_bytes()[8 + len(ours_raw):] == expected_data
    loaded = load_file(str(tmp_path / "mapped.safetensors"))
    assert all(torch.equal(loaded[name], state[name]) for name in state)


def test_a_placed_weight_is_the_file_and_is_not_copied_again(tmp_path: Path) -> None:
    state = mixed_state()
    path = tmp_path / "mapped.safetensors"
    mapped = MappedSafetensors.create(path, state, METADATA, sort=True)
    assert mapped is not None
    name = "encoder.layers.0.mlp.fc1.weight"
    new = torch.full_like(state[name], 0.75)
    held = mapped.place(name, new)
    assert held.data_ptr() == mapped.view(name).data_ptr()
    # Written through the mapping, before anything else is: the file has it already.
    assert torch.equal(load_file(str(path))[name], new)
    # The module keeps the view and changes it in place (+0.0 for -0.0, as the build does).
    held.add_(0.25)
    mapped.write({**state, name: held})
    assert torch.equal(load_file(str(path))[name], torch.full_like(new, 1.0))
    with pytest.raises(ValueError, match="does not fit its place"):
        mapped.place(name, new.to(torch.float16))
    with pytest.raises(ValueError, match="not the ones laid out"):
        mapped.write({name: held})
