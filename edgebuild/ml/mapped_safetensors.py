"""A SafeTensors file laid out before its tensors are computed, filled through a shared mapping.

A GPTQ build makes 1.6 GB of new weights and then writes them to ``model.safetensors``:
the weights are allocated once as process memory and once more as the file's page
cache, and on a virtual machine whose freed memory goes back to the host each of those
gigabytes is faulted in afresh (``bench/store_copy.py`` explains). Laid out first, the
file's own pages hold the weights: each reconstructed weight is written straight into
its place in the file (the GPTQ kernel writes into ``view``), the model keeps that view
as its parameter, and saving only copies in what was not placed (norms, biases,
embeddings) -- one allocation, no write, no copy.

The bytes are those ``safetensors.torch.save_file`` writes: the order of the tensors in
the data is asked of safetensors itself (a probe of the same names and dtypes, one
element each), the header is rendered as its writer renders it and checked against the
probe's, and the ``__metadata__`` keys are in sorted order (safetensors writes them in
a hash map's order, which varies from process to process). With ``sort`` the header is
the one ``sort_header`` gives. Where any of that cannot be reproduced (another
safetensors, a filesystem that cannot reserve the space), ``create`` returns ``None``
and the caller writes with ``save_file``.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def sort_header(header: bytes) -> bytes:
    """``header`` (a SafeTensors JSON header, padding included) with ``__metadata__``
    first and every key sorted, padded with spaces to the same length, so the data
    offsets hold."""
    parsed = json.loads(header)
    metadata = parsed.pop("__metadata__", None)
    ordered = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
    ordered.update(sorted(parsed.items()))
    encoded = json.dumps(ordered, separators=(",", ":")).encode()
    if len(encoded) > len(header):
        raise ValueError("sorted header does not fit")
    return encoded + b" " * (len(header) - len(encoded))


def _render(entries: list[tuple[str, str, list[int], int, int]], metadata: dict[str, str] | None) -> bytes:
    """The header as safetensors' writer renders it (compact JSON, metadata first,
    tensors in data order), padded with spaces to a multiple of 8."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    for name, dtype, shape, start, end in entries:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return encoded + b" " * (-len(encoded) % 8)


def _data_order(tensors: dict[str, "torch.Tensor"]) -> tuple[list[str], dict[str, str]] | None:
    """The order safetensors gives ``tensors``' data, and each one's dtype name, from a
    probe of one element per tensor; ``None`` when the header it writes is not the one
    :func:`_render` gives for it."""
    import torch
    from safetensors.torch import save

    probe = save({name: torch.zeros(1, dtype=tensor.dtype) for name, tensor in tensors.items()})
    (length,) = struct.unpack("<Q", probe[:8])
    header = json.loads(probe[8 : 8 + length])
    order = sorted(header, key=lambda name: header[name]["data_offsets"][0])
    dtypes = {name: header[name]["dtype"] for name in order}
    entries = [(name, dtypes[name], header[name]["shape"], *header[name]["data_offsets"]) for name in order]
    if _render(entries, None) != probe[8 : 8 + length]:
        return None
    return order, dtypes


class MappedSafetensors:
    """``path``, created at its final size, with a view of every tensor's bytes."""

    def __init__(self, path: Path, views: dict[str, "torch.Tensor"], buffer: mmap.mmap) -> None:
        self.path = path
        self._views = views
        self._buffer = buffer

    @classmethod
    def create(
        cls, path: Path, tensors: dict[str, "torch.Tensor"], metadata: dict[str, str], sort: bool
    ) -> "MappedSafetensors | None":
        """Lay out ``path`` for tensors of ``tensors``' names, dtypes and shapes (the
        values are not read); ``None`` where the file cannot be laid out exactly as
        ``save_file`` would write it."""
        import torch

        if any(tensor.device.type != "cpu" for tensor in tensors.values()):
            return None
        known = _data_order(tensors)
        if known is None:
            return None
        order, dtypes = known
        entries, offset = [], 0
        for name in order:
            tensor = tensors[name]
            size = tensor.numel() * tensor.element_size()
            entries.append((name, dtypes[name], list(tensor.shape), offset, offset + size))
            offset += size
        header = _render(entries, dict(sorted(metadata.items())) if metadata else None)
        if sort:
            header = sort_header(header)
        start = 8 + len(header)
        if any((start + begin) % tensors[name].element_size() for name, _dtype, _shape, begin, _end in entries):
            # safetensors orders by dtype, widest first, so this does not happen; a
            # misaligned view would be slow, not wrong: refuse it all the same.
            return None
        total = start + offset
        handle = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            try:
                # Reserve the blocks now: a full disk is an error here, not a SIGBUS
                # when a page of the mapping is first written.
                os.posix_fallocate(handle, 0, total)
            except OSError as error:
                if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                path.unlink(missing_ok=True)
                return None
            os.pwrite(handle, struct.pack("<Q", len(header)) + header, 0)
            buffer = mmap.mmap(handle, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(handle)
        whole = torch.frombuffer(buffer, dtype=torch.uint8)
        views = {
            name: whole[start + begin : start + end].view(tensors[name].dtype).reshape(shape)
            for name, _dtype, shape, begin, end in entries
        }
        return cls(path, views, buffer)

    def view(self, name: str) -> "torch.Tensor":
        """Tensor ``name``'s bytes in the file: what is written into it is in the file."""
        return self._views[name]

    def place(self, name: str, value: "torch.Tensor") -> "torch.Tensor":
        """Copy ``value`` into tensor ``name``'s place and return the view holding it."""
        view = self._views[name]
        if value.dtype != view.dtype or tuple(value.shape) != tuple(view.shape):
            raise ValueError(f"{name}: {value.dtype} {tuple(value.shape)} does not fit its place "
                             f"({view.dtype} {tuple(view.shape)})")
        view.copy_(value)
        return view

    def write(self, tensors: dict[str, "torch.Tensor"]) -> None:
        """Give every tensor of the layout its value from ``tensors``; one that is its
        place already (placed, then kept by the model) is not copied."""
        if sorted(tensors) != sorted(self._views):
            raise ValueError(f"{self.path}: the tensors to write are not the ones laid out")
        for name, value in tensors.items():
            view = self._views[name]
            if value.data_ptr() == view.data_ptr() and value.dtype == view.dtype and value.is_contiguous():
                continue
            self.place(name, value.detach().contiguous())
