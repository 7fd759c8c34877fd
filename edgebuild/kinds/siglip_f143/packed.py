"""The packed form, ``model.f143.safetensors``: each quantized weight as
``F8_E4M3FNUZ`` codes plus ``<name>.f143_exponent`` int8 tile exponents (about a
quarter of float32); :func:`load_packed` gives back the float weights bit for bit.
Also the SafeTensors writing both files share."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.plugin import CheckpointError

if TYPE_CHECKING:
    import torch

EXPONENT_SUFFIX = ".f143_exponent"
PACKED_FORMAT = "edgebuild-f143-v1"
# Bytes per element of the dtypes a packed file holds.
_DTYPE_BYTES = {"F8_E4M3FNUZ": 1, "I8": 1, "F32": 4, "BF16": 2, "F16": 2}


def pack_state(state: dict[str, "torch.Tensor"], quantized: list[str], block_size: int) -> dict[str, "torch.Tensor"]:
    from edgebuild.ml.quant.f143 import pack

    packed = {}
    for name, tensor in state.items():
        if name in quantized:
            codes, exponents = pack(tensor, block_size)
            packed[name] = codes
            packed[name + EXPONENT_SUFFIX] = exponents
        else:
            packed[name] = tensor
    return packed


def load_packed(path: Path) -> dict[str, "torch.Tensor"]:
    """The float state dict back from the packed form, bit for bit equal to ``model.safetensors``."""
    from safetensors import safe_open

    from edgebuild.ml.quant.f143 import unpack

    with safe_open(str(path), framework="pt", device="cpu") as source:
        metadata = source.metadata() or {}
        if metadata.get("format_f143") != PACKED_FORMAT:
            raise CheckpointError(f"{path}: not an edgebuild F143 packed file (format_f143={metadata.get('format_f143')!r})")
        block_size = int(metadata["block_size"])
        names = set(source.keys())
        state = {}
        for name in sorted(names):
            if name.endswith(EXPONENT_SUFFIX):
                continue
            tensor = source.get_tensor(name)
            if name + EXPONENT_SUFFIX in names:
                tensor = unpack(tensor, source.get_tensor(name + EXPONENT_SUFFIX), block_size)
            state[name] = tensor
    return state


def save_safetensors(tensors: dict[str, "torch.Tensor"], path: Path, metadata: dict[str, str], sort: bool) -> None:
    from safetensors.torch import save_file

    save_file({name: value.detach().cpu().contiguous() for name, value in tensors.items()}, str(path), metadata=metadata)
    if sort:
        sort_metadata(path)


def sort_metadata(path: Path) -> None:
    """Rewrite the header with sorted keys: same length, so the data offsets hold."""
    import struct

    from edgebuild.ml.mapped_safetensors import sort_header

    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        try:
            ordered = sort_header(handle.read(length))
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None
        handle.seek(8)
        handle.write(ordered)


def stored_bytes(source: Any, name: str) -> int:
    """Bytes of tensor ``name`` in an open SafeTensors file, from its header."""
    tensor_slice = source.get_slice(name)
    count = 1
    for dimension in tensor_slice.get_shape():
        count *= dimension
    return count * _DTYPE_BYTES[tensor_slice.get_dtype()]
