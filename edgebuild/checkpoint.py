"""Reading checkpoints by tensor, never by shard.

A real Qwen3.5 checkpoint keeps its 461 M-parameter vision tower in the same
multi-GB shard as ``lm_head`` and ``embed_tokens``. Everything here works from
the SafeTensors headers: which tensors exist, where their bytes are, and only
then reads the bytes of the tensors a kind asked for.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# A header larger than this is not a SafeTensors header but a corrupt or foreign file.
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes live: absolute byte range ``[start, end)`` in ``file``."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a SafeTensors file and the offset its data starts at."""
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise CheckpointError(f"{path}: not a SafeTensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path}: not a SafeTensors file (header length {length} bytes)")
            raw = handle.read(length)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not a SafeTensors file (header is not JSON: {error})") from None
    return header, 8 + length


class Checkpoint:
    """A checkpoint directory: its config and an index of every tensor in its shards."""

    def __init__(self, directory: Path, label: str | None = None) -> None:
        self.directory = Path(directory)
        self.label = label or str(directory)
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.label}: checkpoint directory {self.directory} does not exist")
        self._tensors: dict[str, TensorEntry] | None = None
        self._config: dict[str, Any] | None = None

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            try:
                self._config = json.loads(self.config_path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                raise CheckpointError(f"{self.config_path}: missing (every checkpoint needs a config.json)") from None
            except json.JSONDecodeError as error:
                raise CheckpointError(f"{self.config_path}: invalid JSON: {error}") from None
        return self._config

    def config_section(self, key: str) -> dict[str, Any]:
        section = self.config.get(key)
        if not isinstance(section, dict):
            raise CheckpointError(
                f"{self.config_path}: no '{key}' mapping; expected a checkpoint whose config has a {key}"
            )
        return section

    def shard_files(self) -> list[Path]:
        """Shards from the index when there is one (the index is authoritative), else every ``*.safetensors``."""
        index = self.directory / INDEX_FILE
        if index.exists():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index}: expected a JSON object with a 'weight_map' ({error})") from None
            return [self.directory / name for name in sorted(set(weight_map.values()))]
        shards = sorted(self.directory.glob("*.safetensors"))
        if not shards:
            raise CheckpointError(f"{self.label}: no *.safetensors files in {self.directory}")
        return shards

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        if self._tensors is None:
            tensors: dict[str, TensorEntry] = {}
            for shard in self.shard_files():
                header, data_start = read_header(shard)
                for name, meta in header.items():
                    if name == "__metadata__":
                        continue
                    begin, end = meta["data_offsets"]
                    tensors[name] = TensorEntry(
                        name=name,
                        file=shard,
                        dtype=meta["dtype"],
                        shape=tuple(meta["shape"]),
                        start=data_start + begin,
                        end=data_start + end,
                    )
            self._tensors = tensors
        return self._tensors

    def select(self, prefixes: tuple[str, ...]) -> dict[str, TensorEntry]:
        """Tensors whose names start with one of ``prefixes``; an empty selection is an error."""
        selected = {name: entry for name, entry in self.tensors.items() if name.startswith(prefixes)}
        if not selected:
            raise CheckpointError(
                f"{self.label}: no tensors named {' or '.join(p + '*' for p in prefixes)} in "
                f"{self.directory} ({len(self.tensors)} tensors in "
                f"{', '.join(path.name for path in self.shard_files())})"
            )
        return dict(sorted(selected.items()))

    def load(
        self, entries: dict[str, TensorEntry], strip_prefix: str = "", dtype: Any = None, owned: bool = False
    ) -> dict[str, Any]:
        """Read exactly ``entries`` through ``safe_open``.

        By default the tensors are views of a private file mapping: nothing is
        read until used, which suits read-only use. ``owned=True`` gives each
        tensor memory of its own, for callers that rewrite weights: writing into
        the mapping costs a copy-on-write fault per 4 KiB page, and pages read
        through it stay resident for as long as any tensor of the file lives.
        Each tensor is then read through a mapping that is closed right after,
        so the process never holds the file and the copies at once.
        """
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name, entry in entries.items():
            by_file.setdefault(entry.file, []).append(name)
        state: dict[str, Any] = {}

        def keep(name: str, tensor: Any) -> None:
            key = name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name
            converted = tensor.to(dtype) if dtype is not None else tensor
            state[key] = converted.clone() if owned and converted is tensor else converted

        for path, names in by_file.items():
            if owned:
                for name in names:
                    with safe_open(str(path), framework="pt", device="cpu") as handle:
                        keep(name, handle.get_tensor(name))
            else:
                with safe_open(str(path), framework="pt", device="cpu") as handle:
                    for name in names:
                        keep(name, handle.get_tensor(name))
        return state
