"""Reading checkpoints by tensor, from the SafeTensors headers."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from edgebuild.core.checkpoint import Checkpoint
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


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc/self/maps")
def test_replaced_tensors_of_an_owned_load_stay_views_each_of_its_own_mapping(qwen_checkpoint: Path) -> None:
    import gc

    import torch

    checkpoint = Checkpoint(qwen_checkpoint)
    entries = checkpoint.select(("model.visual.",))
    shards = {str(entry.file) for entry in entries.values()}

    def in_a_shard(tensor: torch.Tensor) -> bool:
        return any(start <= tensor.data_ptr() < end and path in shards for start, end, path in _file_mappings())

    def swapped(name: str) -> bool:
        return name.endswith(".weight") and len(entries["model.visual." + name].shape) == 2

    state = checkpoint.load(entries, strip_prefix="model.visual.", owned=True, replaced=swapped)
    reference = checkpoint.load(entries, strip_prefix="model.visual.")
    assert all(torch.equal(state[name], reference[name]) for name in reference)
    views = sorted(name for name in state if swapped(name))
    assert views and len(views) < len(state)
    assert all(in_a_shard(state[name]) for name in views)
    assert not any(in_a_shard(state[name]) for name in state if name not in views)
    del reference
    gc.collect()
    mapped_before = len([1 for _, _, path in _file_mappings() if path in shards])
    # Swapping one out closes its mapping: no mapping of the file outlives its tensor.
    state[views[0]] = state[views[0]] * 2
    gc.collect()
    assert len([1 for _, _, path in _file_mappings() if path in shards]) == mapped_before - 1


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


# --- a one-shard checkpoint and its header, to corrupt -----------------------------

# What save_file writes for SHARD_TENSORS: bias's 12 bytes, then weight's 24.
BIAS = {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}
WEIGHT = {"dtype": "F32", "shape": [2, 3], "data_offsets": [12, 36]}
CONFIG = {"vision_config": {"depth": 2, "patch_size": 0, "layers": "three", "scale": 3.0, "tied": True}, "width": 8}


def _write_checkpoint(directory: Path) -> Path:
    """A checkpoint with CONFIG and one shard, model.safetensors, holding bias and weight."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(CONFIG))
    save_file({"weight": torch.zeros(2, 3), "bias": torch.zeros(3)}, str(directory / "model.safetensors"))
    return directory


def _rewrite_header(shard: Path, header: Any) -> None:
    """Put ``header`` (any JSON) in place of the shard's own header, keeping its data bytes."""
    raw = shard.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    encoded = json.dumps(header).encode()
    shard.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length:])


def _error(call: Any) -> str:
    with pytest.raises(CheckpointError) as caught:
        call()
    return str(caught.value)


def test_checkpoint_headers_as_written_by_safetensors(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    dtypes = {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
        "F8_E5M2FNUZ": torch.float8_e5m2fnuz, "F8_E8M0": torch.float8_e8m0fnu, "C64": torch.complex64,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
        "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool,
    }
    state = {name: torch.zeros(3, 2, dtype=dtype) for name, dtype in dtypes.items()}
    state["F4"] = torch.zeros(3, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    state["empty"] = torch.zeros(0, 5)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    assert {name: entry.dtype for name, entry in Checkpoint(tmp_path).tensors.items()} == {
        **{name: name for name in dtypes}, "F4": "F4", "empty": "F32"
    }


@pytest.mark.parametrize(
    "header, expected",
    [
        ([BIAS, WEIGHT], "not a SafeTensors file (header is a JSON array, expected a JSON object)"),
        (
            {"__metadata__": ["format", "pt"], "bias": BIAS, "weight": WEIGHT},
            "__metadata__: expected an object of strings, found a JSON array",
        ),
        (
            {"__metadata__": {"format": 1}, "bias": BIAS, "weight": WEIGHT},
            "__metadata__ -> format: expected a string, found 1",
        ),
        (
            {"bias": "F32", "weight": WEIGHT},
            "tensor 'bias': expected an object with dtype, shape, data_offsets, found a string",
        ),
        (
            {"bias": {"data_offsets": [0, 12]}, "weight": WEIGHT},
            "tensor 'bias': no dtype, shape; expected an object with dtype, shape, data_offsets",
        ),
        (
            {"bias": {**BIAS, "dtype": "F8_E4M3FN"}, "weight": WEIGHT},
            "tensor 'bias': unknown dtype \"F8_E4M3FN\"; expected one of BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, "
            "F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, "
            "I64, U64",
        ),
        (
            {"bias": {**BIAS, "shape": [3.0]}, "weight": WEIGHT},
            "tensor 'bias': shape: expected a list of non-negative integers, found [3.0]",
        ),
        (
            {"bias": {**BIAS, "shape": [True, 3]}, "weight": WEIGHT},
            "tensor 'bias': shape: expected a list of non-negative integers, found [true, 3]",
        ),
        (
            {"bias": {**BIAS, "shape": [4]}, "weight": WEIGHT},
            "tensor 'bias': wrong shape: F32 [4] is 16 bytes, but data_offsets [0, 12] hold 12 bytes",
        ),
        (
            {"bias": {**BIAS, "dtype": "F4"}, "weight": WEIGHT},
            "tensor 'bias': wrong shape: F4 [3] is 12 bits, not a whole number of bytes",
        ),
        (
            {"bias": {**BIAS, "data_offsets": [0]}, "weight": WEIGHT},
            "tensor 'bias': data_offsets: expected [begin, end] with 0 <= begin <= end, found [0]",
        ),
        (
            {"bias": {**BIAS, "data_offsets": [-12, 0]}, "weight": WEIGHT},
            "tensor 'bias': data_offsets: expected [begin, end] with 0 <= begin <= end, found [-12, 0]",
        ),
        (
            {"bias": {**BIAS, "data_offsets": [12, 0]}, "weight": WEIGHT},
            "tensor 'bias': data_offsets: expected [begin, end] with 0 <= begin <= end, found [12, 0]",
        ),
        (
            {"bias": BIAS, "weight": {**WEIGHT, "data_offsets": [8, 32]}},
            "tensor 'weight': data_offsets [8, 32] overlap tensor 'bias', which ends at 12",
        ),
        (
            {"bias": {**BIAS, "shape": [2], "data_offsets": [0, 8]}, "weight": WEIGHT},
            "data bytes [8, 12) belong to no tensor; expected tensor 'weight' to begin at 8, found 12",
        ),
        (
            {"bias": BIAS, "weight": WEIGHT, "extra": {"dtype": "U8", "shape": [4], "data_offsets": [36, 40]}},
            "truncated: tensor 'extra' ends at data byte 40, but the file holds 36",
        ),
        (
            {"bias": BIAS},
            "24 bytes after the last tensor belong to no tensor (the tensors end at data byte 12, the file holds 36)",
        ),
    ],
    ids=[
        "header-is-a-list", "metadata-not-an-object", "metadata-value-not-a-string", "entry-not-an-object",
        "entry-missing-keys", "unknown-dtype", "shape-of-floats", "shape-of-booleans", "wrong-shape",
        "partial-byte", "one-offset", "negative-offset", "begin-after-end", "overlap", "gap", "past-the-end",
        "bytes-after-the-last-tensor",
    ],
)
def test_bad_header(tmp_path: Path, header: Any, expected: str) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    _rewrite_header(checkpoint / "model.safetensors", header)
    assert _error(lambda: Checkpoint(checkpoint).tensors) == f"{checkpoint / 'model.safetensors'}: {expected}"


def test_shard_truncated_in_its_header(tmp_path: Path) -> None:
    shard = _write_checkpoint(tmp_path / "ckpt") / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:50])
    assert _error(lambda: Checkpoint(shard.parent).tensors) == (
        f"{shard}: truncated: its header is 120 bytes, but the file holds 50 bytes in all"
    )


def test_shard_truncated_in_its_data(tmp_path: Path) -> None:
    shard = _write_checkpoint(tmp_path / "ckpt") / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    assert _error(lambda: Checkpoint(shard.parent).tensors) == (
        f"{shard}: truncated: tensor 'weight' ends at data byte 36, but the file holds 26"
    )


def test_tensor_in_two_loose_shards(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    (checkpoint / "model.safetensors").rename(checkpoint / "a.safetensors")
    shutil.copy(checkpoint / "a.safetensors", checkpoint / "b.safetensors")
    assert _error(lambda: Checkpoint(checkpoint).tensors) == (
        f"{checkpoint / 'b.safetensors'}: tensor 'bias' is also in {checkpoint / 'a.safetensors'}"
    )


def test_without_an_index_model_safetensors_is_the_model(tmp_path: Path) -> None:
    """transformers' rule: other SafeTensors files beside model.safetensors (the packed
    copy in a built siglip_f143 directory) are not part of the model."""
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    shutil.copy(checkpoint / "model.safetensors", checkpoint / "model.f143.safetensors")
    loaded = Checkpoint(checkpoint)
    assert loaded.shard_files() == [checkpoint / "model.safetensors"]
    assert {entry.file.name for entry in loaded.tensors.values()} == {"model.safetensors"}
    assert loaded.file_names_read(("extra.json",)) == ["config.json", "extra.json", "model.safetensors"]


def test_missing_files_names_every_file_a_kind_needs(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    assert Checkpoint(checkpoint).missing_files(("preprocessor_config.json",)) == ["preprocessor_config.json"]
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "config.json").unlink()
    assert Checkpoint(checkpoint).missing_files() == ["config.json", "model.safetensors"]
    index = {"weight_map": {"bias": "model-00001-of-00002.safetensors", "weight": "model-00002-of-00002.safetensors"}}
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    (checkpoint / "model-00001-of-00002.safetensors").write_bytes(b"")
    # A link to a blob that is gone (a pruned Hugging Face cache) is missing too.
    (checkpoint / "model-00002-of-00002.safetensors").symlink_to(tmp_path / "blobs" / "gone")
    assert Checkpoint(checkpoint).missing_files() == ["config.json", "model-00002-of-00002.safetensors"]


@pytest.mark.parametrize(
    "index, expected",
    [
        ([], "expected a JSON object, found a JSON array"),
        ({"metadata": {}}, "weight_map: expected an object of tensor names to shard files, found nothing"),
        ({"weight_map": {"bias": 3}}, "weight_map -> bias: expected a shard file name, found 3"),
        (
            {"weight_map": {"bias": "model.safetensors", "weight": "model-00002.safetensors"}},
            "weight_map -> weight: shard model-00002.safetensors does not exist in {checkpoint}",
        ),
        (
            {"weight_map": {"bias": "../outside.safetensors"}},
            "weight_map -> bias: shard ../outside.safetensors is outside the checkpoint directory {checkpoint}",
        ),
        (
            {"weight_map": {"bias": "model.safetensors", "lm_head.weight": "model.safetensors"}},
            "weight_map -> lm_head.weight: expected in model.safetensors, found no such tensor",
        ),
    ],
    ids=[
        "not-an-object", "no-weight-map", "shard-not-a-string", "missing-shard", "shard-outside",
        "tensor-not-in-shard",
    ],
)
def test_bad_index(tmp_path: Path, index: Any, expected: str) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    # The escaping shard exists: the index is refused for where it points, not for a missing file.
    shutil.copy(checkpoint / "model.safetensors", tmp_path / "outside.safetensors")
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    assert _error(lambda: Checkpoint(checkpoint).tensors) == (
        f"{checkpoint / 'model.safetensors.index.json'}: {expected.format(checkpoint=checkpoint)}"
    )


def test_checkpoint_directory_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert _error(lambda: Checkpoint(tmp_path / "model.safetensors", label="checkpoint 'q'")) == (
        f"checkpoint 'q': checkpoint directory {tmp_path / 'model.safetensors'} is a file, not a directory"
    )


def test_config_is_not_an_object(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    (checkpoint / "config.json").write_text("[1, 2]")
    assert _error(lambda: Checkpoint(checkpoint).config) == (
        f"{checkpoint / 'config.json'}: expected a JSON object, found a JSON array"
    )


def test_config_is_not_utf8(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    (checkpoint / "config.json").write_bytes(b'{"name": "\xff"}')
    assert _error(lambda: Checkpoint(checkpoint).config) == (
        f"{checkpoint / 'config.json'}: not UTF-8 text (invalid start byte at byte 10)"
    )


def test_config_is_unreadable(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    (checkpoint / "config.json").unlink()
    (checkpoint / "config.json").mkdir()
    assert _error(lambda: Checkpoint(checkpoint).config) == (
        f"{checkpoint / 'config.json'}: a directory, not a regular file; expected a JSON file"
    )


def test_config_int_reads_valid_values(tmp_path: Path) -> None:
    checkpoint = Checkpoint(_write_checkpoint(tmp_path / "ckpt"))
    assert checkpoint.config_int("vision_config", "depth", minimum=1) == 2
    assert checkpoint.config_int("vision_config", "heads", default=4, minimum=1) == 4
    assert checkpoint.config_int(None, "width") == 8


@pytest.mark.parametrize(
    "section, key, default, expected",
    [
        ("vision_config", "layers", None, "vision_config -> layers: expected an integer >= 1, found \"three\""),
        ("vision_config", "patch_size", None, "vision_config -> patch_size: expected an integer >= 1, found 0"),
        ("vision_config", "scale", None, "vision_config -> scale: expected an integer >= 1, found 3.0"),
        ("vision_config", "tied", None, "vision_config -> tied: expected an integer >= 1, found true"),
        ("vision_config", "heads", None, "vision_config -> heads: missing; expected an integer >= 1"),
        ("text_config", "depth", 1, "no 'text_config' mapping; expected a checkpoint whose config has a text_config"),
    ],
    ids=["string", "below-minimum", "float", "boolean", "missing", "no-section"],
)
def test_config_int_refuses(tmp_path: Path, section: str, key: str, default: int | None, expected: str) -> None:
    checkpoint = Checkpoint(_write_checkpoint(tmp_path / "ckpt"))
    assert _error(lambda: checkpoint.config_int(section, key, default=default, minimum=1)) == (
        f"{checkpoint.config_path}: {expected}"
    )


def test_check_float_tensors(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    shard = checkpoint / "model.safetensors"
    _rewrite_header(shard, {"bias": BIAS, "weight": {**WEIGHT, "dtype": "I32"}})
    entries = Checkpoint(checkpoint).tensors
    Checkpoint.check_float_tensors({"bias": entries["bias"]})
    assert _error(lambda: Checkpoint.check_float_tensors(entries)) == (
        f"{shard}: tensor 'weight': expected a floating-point dtype "
        "(F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ, F8_E8M0), found I32"
    )


def test_load_reports_a_dtype_torch_cannot_read(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    shard = checkpoint / "model.safetensors"
    # 16 six-bit elements are weight's first 12 bytes.
    _rewrite_header(shard, {
        "bias": BIAS,
        "weight": {"dtype": "F6_E2M3", "shape": [16], "data_offsets": [12, 24]},
        "rest": {"dtype": "U8", "shape": [12], "data_offsets": [24, 36]},
    })
    loaded = Checkpoint(checkpoint)
    assert _error(lambda: loaded.load(loaded.select(("weight",)))) == (
        f"{shard}: tensor 'weight': cannot read: Dtype not understood: F6_E2M3"
    )


def test_load_reports_a_shard_changed_since_its_header_was_read(tmp_path: Path) -> None:
    checkpoint = _write_checkpoint(tmp_path / "ckpt")
    shard = checkpoint / "model.safetensors"
    loaded = Checkpoint(checkpoint)
    entries = loaded.select(("bias",))
    shard.write_bytes(shard.read_bytes()[:-10])
    assert _error(lambda: loaded.load(entries)) == (
        f"{shard}: cannot open for reading tensors: Error while deserializing header: "
        "incomplete metadata, file not fully covered"
    )
