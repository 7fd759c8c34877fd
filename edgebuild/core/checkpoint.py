"""Reading checkpoints by tensor, never by shard.

A real Qwen3.5 checkpoint keeps its 461 M-parameter vision tower in the same
multi-GB shard as ``lm_head`` and ``embed_tokens``. Everything here works from
the SafeTensors headers: which tensors exist, where their bytes are, and only
then reads the bytes of the tensors a kind asked for.

Headers, ``config.json`` and the shard index come from outside, so each is
checked in full before anything uses it: a bad one is a ``CheckpointError``
naming the file, the key or tensor, what was expected and what was found.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.files import UnreadableFile, json_kind, open_regular, parse_json, read_bytes
from edgebuild.errors import CheckpointError

if TYPE_CHECKING:
    from edgebuild.core.hub import HubSnapshot

INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
# The weights of a checkpoint without an index, as transformers reads them.
WEIGHTS_FILE = "model.safetensors"
# The files a Hugging Face tokenizer may be saved as (any of them, beside config.json).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model")
# A header larger than this is not a SafeTensors header but a corrupt or foreign file.
MAX_HEADER_BYTES = 100 * 1024 * 1024
# config.json, an index of shards, a preprocessor config: kilobytes to a few megabytes.
CONFIG_BYTES = 64 << 20
METADATA_KEY = "__metadata__"
TENSOR_KEYS = ("dtype", "shape", "data_offsets")

# Bits per element of every dtype the SafeTensors format has (its ``Dtype`` enum,
# safetensors 0.8). F4 and F6 pack elements across byte boundaries.
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
# Dtypes a model's floating-point weights can come in: torch reads each of them
# element for element and converts it to any float dtype. F4 and F6 are left out
# (torch reads F4 as packed pairs and F6 not at all), as is C64 (converting it
# drops the imaginary part).
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0")


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


def _found(value: Any) -> str:
    """A value as its file spells it, shortened: a corrupt header can hold megabytes."""
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_count(value: Any) -> bool:
    """A non-negative JSON integer (``true`` is a bool in JSON, not 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold an object."""
    try:
        data = read_bytes(path, CONFIG_BYTES)
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except UnreadableFile as error:
        raise CheckpointError(f"{path}: {error}; expected a JSON file") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read ({error.strerror})") from None
    try:
        content = parse_json(text)
    except UnreadableFile as error:
        raise CheckpointError(f"{path}: invalid JSON: {str(error).removeprefix('not valid JSON: ')}") from None
    if not isinstance(content, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {json_kind(content, qualified=True)}")
    return content


def _check_metadata(path: Path, metadata: Any) -> None:
    # safetensors accepts "__metadata__": null as no metadata.
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: {METADATA_KEY}: expected an object of strings, found {json_kind(metadata, qualified=True)}")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise CheckpointError(f"{path}: {METADATA_KEY} -> {key}: expected a string, found {_found(value)}")


def _tensor_span(path: Path, name: str, meta: Any) -> tuple[int, int]:
    """The ``data_offsets`` of one header entry, once its dtype, shape and offsets agree."""
    where = f"{path}: tensor '{name}'"
    if not isinstance(meta, dict):
        raise CheckpointError(
            f"{where}: expected an object with {', '.join(TENSOR_KEYS)}, found {json_kind(meta, qualified=True)}"
        )
    missing = [key for key in TENSOR_KEYS if key not in meta]
    if missing:
        raise CheckpointError(f"{where}: no {', '.join(missing)}; expected an object with {', '.join(TENSOR_KEYS)}")
    dtype, shape, offsets = (meta[key] for key in TENSOR_KEYS)
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise CheckpointError(
            f"{where}: unknown dtype {_found(dtype)}; expected one of {', '.join(DTYPE_BITS)}"
        )
    if not isinstance(shape, list) or not all(_is_count(size) for size in shape):
        raise CheckpointError(f"{where}: shape: expected a list of non-negative integers, found {_found(shape)}")
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(offset) for offset in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise CheckpointError(
            f"{where}: data_offsets: expected [begin, end] with 0 <= begin <= end, found {_found(offsets)}"
        )
    begin, end = offsets
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise CheckpointError(f"{where}: wrong shape: {dtype} {shape} is {bits} bits, not a whole number of bytes")
    if bits // 8 != end - begin:
        raise CheckpointError(
            f"{where}: wrong shape: {dtype} {shape} is {bits // 8} bytes, "
            f"but data_offsets {offsets} hold {end - begin} bytes"
        )
    return begin, end


def _check_layout(path: Path, spans: dict[str, tuple[int, int]], data_size: int) -> None:
    """safetensors opens a file only if its tensors tile the data exactly: in offset
    order each begins where the one before ended, and the last ends with the file.
    Checking that here reports what ``safe_open`` would refuse later, by tensor."""
    cursor, previous = 0, None
    for name, (begin, end) in sorted(spans.items(), key=lambda item: (item[1], item[0])):
        if begin < cursor:
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] overlap tensor '{previous}', "
                f"which ends at {cursor}"
            )
        if begin > cursor:
            raise CheckpointError(
                f"{path}: data bytes [{cursor}, {begin}) belong to no tensor; "
                f"expected tensor '{name}' to begin at {cursor}, found {begin}"
            )
        cursor, previous = end, name
    if cursor > data_size:
        raise CheckpointError(
            f"{path}: truncated: tensor '{previous}' ends at data byte {cursor}, but the file holds {data_size}"
        )
    if cursor < data_size:
        raise CheckpointError(
            f"{path}: {data_size - cursor} bytes after the last tensor belong to no tensor "
            f"(the tensors end at data byte {cursor}, the file holds {data_size})"
        )


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a SafeTensors file and the offset its data starts at.

    The header is checked in full, against the file's size too: every entry
    other than ``__metadata__`` is a tensor with a known dtype, a shape whose
    size is its byte range, and ranges that tile the data region.
    """
    try:
        with open_regular(path) as handle:
            file_size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise CheckpointError(f"{path}: not a SafeTensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise CheckpointError(f"{path}: not a SafeTensors file (header length {length} bytes)")
            raw = handle.read(length)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read ({error.strerror})") from None
    if len(raw) != length:
        raise CheckpointError(
            f"{path}: truncated: its header is {length} bytes, but the file holds {file_size} bytes in all"
        )
    try:
        header = parse_json(raw)
    except UnreadableFile as error:
        raise CheckpointError(f"{path}: not a SafeTensors file (header is not JSON of a few levels: {error})") from None
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{path}: not a SafeTensors file (header is {json_kind(header, qualified=True)}, expected a JSON object)"
        )
    _check_metadata(path, header.get(METADATA_KEY))
    spans = {name: _tensor_span(path, name, meta) for name, meta in header.items() if name != METADATA_KEY}
    _check_layout(path, spans, data_size=file_size - 8 - length)
    return header, 8 + length


def _open_shard(path: Path) -> Any:
    """``safe_open`` on a shard whose header was checked: it fails only if the file
    changed since."""
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: cannot open for reading tensors: {error}") from None


def _read_tensor(handle: Any, path: Path, name: str) -> Any:
    """One tensor of an open shard; it fails for a dtype torch cannot hold (F6)."""
    from safetensors import SafetensorError

    try:
        return handle.get_tensor(name)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path}: tensor '{name}': cannot read: {error}") from None


def _first_tensor_of_each_shard(weight_map: dict[str, str]) -> dict[str, str]:
    """shard -> the first tensor the index places in it (messages name a tensor per shard)."""
    first: dict[str, str] = {}
    for name, shard in weight_map.items():
        first.setdefault(shard, name)
    return first


class Checkpoint:
    """A checkpoint directory: its config and an index of every tensor in its shards.

    ``origin`` is the Hugging Face cache snapshot the directory is, when it is one:
    a file missing from it is then reported with the command that downloads it.
    """

    def __init__(self, directory: Path, label: str | None = None, origin: "HubSnapshot | None" = None) -> None:
        self.directory = Path(directory)
        self.label = label or str(directory)
        self.origin = origin
        if self.directory.is_file():
            raise CheckpointError(f"{self.label}: checkpoint directory {self.directory} is a file, not a directory")
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.label}: checkpoint directory {self.directory} does not exist")
        self._tensors: dict[str, TensorEntry] | None = None
        self._config: dict[str, Any] | None = None
        self._weight_map: dict[str, str] | None = None
        self._selections: dict[tuple[str, ...], dict[str, TensorEntry]] = {}
        self._once: dict[Any, Any] = {}
        # What kinds read, by name (tensors through ``load``, other files through
        # ``file``): the fingerprint-coverage tests compare these with the fingerprints.
        self.tensors_read: set[str] = set()
        self.files_read: set[str] = set()

    def once(self, key: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, once per ``key`` for this checkpoint: a check or a value derived
        from what this object reads once anyway (its config, its tensor index). A matrix of
        thousands of artifacts checks one checkpoint. An error is not kept: it is raised
        again at the next call."""
        if key not in self._once:
            self._once[key] = compute()
        return self._once[key]

    def has_file(self, relative: str) -> bool:
        """Whether the checkpoint has the regular file ``relative`` (asked once per name, as
        the config is read once)."""
        return bool(self.once(("has file", relative), lambda: (self.directory / relative).is_file()))

    @property
    def config_path(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def index_path(self) -> Path:
        return self.directory / INDEX_FILE

    @property
    def config(self) -> dict[str, Any]:
        if self._config is None:
            if not self.config_path.exists():
                raise CheckpointError(
                    f"{self.config_path}: missing (every checkpoint needs a config.json){self._download_hint(CONFIG_FILE)}"
                )
            self._config = _read_json_object(self.config_path)
        return self._config

    def file(self, name: str) -> Path:
        """The checkpoint file ``name`` (beside ``config.json``), for a kind to read.

        Every file a kind reads is read through here, and recorded in
        ``files_read``: a kind's fingerprint must cover each one (its
        ``TensorSelection.files``), and the tests check that it does.
        """
        path = self.directory / name
        if not path.is_file():
            found = "is not a file" if path.exists() else "is missing"
            raise CheckpointError(f"{path}: {found} ({self.label} must provide it){self._download_hint(name)}")
        self.files_read.add(name)
        return path

    def _download_hint(self, *names: str) -> str:
        """``; download it with: ...`` for a Hugging Face snapshot, else nothing."""
        if self.origin is None:
            return ""
        return f"; download {'it' if len(names) == 1 else 'them'} with: {self.origin.download_command(names)}"

    def missing_files(self, extra: tuple[str, ...] = ()) -> list[str]:
        """The files a kind needs that the directory lacks (a partial download): ``config.json``,
        the weights (the index and every shard it names, else ``model.safetensors``), and
        ``extra``. A link to a missing blob counts as missing."""
        missing = [] if self.config_path.is_file() else [CONFIG_FILE]
        if self.index_path.is_file():
            shards = sorted(set(self._read_weight_map().values()))
            missing += [shard for shard in shards if not (self.directory / shard).is_file()]
        elif not self._weight_files_without_index():
            missing.append(WEIGHTS_FILE)
        missing += [name for name in extra if not (self.directory / name).is_file()]
        return missing

    def check_complete(self, where: str, extra: tuple[str, ...] = ()) -> None:
        """For a Hugging Face snapshot: every file a kind reads is there (``config.json``,
        the index and its shards or ``model.safetensors``, and ``extra``); else one error
        naming them all and the command that downloads them. ``where`` prefixes it."""
        missing = self.missing_files(extra) if self.origin is not None else []
        if missing:
            snapshot = self.origin
            assert snapshot is not None
            files = ", ".join(missing)
            raise CheckpointError(
                f"{where}: {snapshot.description} lacks {files} in the Hugging Face cache ({snapshot.directory}); "
                f"download {'it' if len(missing) == 1 else 'them'} with: {snapshot.download_command(missing)}"
            )

    def file_names_read(self, extra: tuple[str, ...] = ()) -> list[str]:
        """The names, relative to the directory, of the files a kind reads from this checkpoint:
        ``config.json``, the index if any, every shard, and ``extra``."""
        names = [CONFIG_FILE]
        if self.index_path.is_file():
            names.append(INDEX_FILE)
        names += [path.relative_to(self.directory).as_posix() for path in self.shard_files()]
        return sorted(set(names) | set(extra))

    def config_section(self, key: str) -> dict[str, Any]:
        section = self.config.get(key)
        if not isinstance(section, dict):
            raise CheckpointError(
                f"{self.config_path}: no '{key}' mapping; expected a checkpoint whose config has a {key}"
            )
        return section

    def config_int(
        self, section: str | None, key: str, default: int | None = None, minimum: int | None = None
    ) -> int:
        """``config[section][key]`` (``config[key]`` when ``section`` is None) as an
        integer of at least ``minimum``; ``default`` when the key is absent, which is
        an error when there is no default. ``null`` is a value, not an absence."""
        values = self.config if section is None else self.config_section(section)
        where = key if section is None else f"{section} -> {key}"
        expected = "an integer" if minimum is None else f"an integer >= {minimum}"
        if key not in values:
            if default is None:
                raise CheckpointError(f"{self.config_path}: {where}: missing; expected {expected}")
            return default
        value = values[key]
        if not (isinstance(value, int) and not isinstance(value, bool)) or (minimum is not None and value < minimum):
            raise CheckpointError(f"{self.config_path}: {where}: expected {expected}, found {_found(value)}")
        return value

    def _index_weight_map(self) -> dict[str, str] | None:
        """The index's tensor -> shard file map, each shard checked to be a file in
        the directory; ``None`` when there is no index."""
        if self._weight_map is None and self.index_path.exists():
            weight_map = self._read_weight_map()
            for shard, name in _first_tensor_of_each_shard(weight_map).items():
                path = self.directory / shard
                if not path.is_file():
                    found = "is not a file" if path.exists() else "does not exist"
                    raise CheckpointError(
                        f"{self.index_path}: weight_map -> {name}: shard {shard} {found} in {self.directory}"
                        f"{self._download_hint(shard)}"
                    )
            self._weight_map = weight_map
        return self._weight_map

    def _read_weight_map(self) -> dict[str, str]:
        """The index's tensor -> shard file map, every shard named inside the directory
        (whether the shards exist is the caller's question)."""
        index = _read_json_object(self.index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict):
            found = "nothing" if "weight_map" not in index else json_kind(weight_map, qualified=True)
            raise CheckpointError(
                f"{self.index_path}: weight_map: expected an object of tensor names to shard files, found {found}"
            )
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard:
                raise CheckpointError(
                    f"{self.index_path}: weight_map -> {name}: expected a shard file name, found {_found(shard)}"
                )
        for shard, name in _first_tensor_of_each_shard(weight_map).items():
            # Checked by name, not by resolving: shards in a Hugging Face cache are
            # links out of the directory, which is where they belong.
            relative = PurePosixPath(shard)
            if relative.is_absolute() or ".." in relative.parts:
                raise CheckpointError(
                    f"{self.index_path}: weight_map -> {name}: shard {shard} is outside the checkpoint directory {self.directory}"
                )
        return weight_map

    def _weight_files_without_index(self) -> list[Path]:
        # transformers' rule: without an index the weights are model.safetensors, and
        # other SafeTensors files beside it (a packed copy of the weights in a built
        # directory, an adapter) are not part of the model. A directory of loose shards
        # without either is read whole.
        weights = self.directory / WEIGHTS_FILE
        if weights.is_file():
            return [weights]
        return sorted(path for path in self.directory.glob("*.safetensors") if path.is_file())

    def shard_files(self) -> list[Path]:
        """Shards from the index when there is one (the index is authoritative), else
        ``model.safetensors``, else every ``*.safetensors``."""
        weight_map = self._index_weight_map()
        if weight_map is not None:
            return [self.directory / name for name in sorted(set(weight_map.values()))]
        shards = self._weight_files_without_index()
        if not shards:
            raise CheckpointError(
                f"{self.label}: no *.safetensors files in {self.directory}{self._download_hint(WEIGHTS_FILE)}"
            )
        return shards

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        if self._tensors is None:
            tensors: dict[str, TensorEntry] = {}
            for shard in self.shard_files():
                header, data_start = read_header(shard)
                for name, meta in header.items():
                    if name == METADATA_KEY:
                        continue
                    if name in tensors:
                        raise CheckpointError(f"{shard}: tensor '{name}' is also in {tensors[name].file}")
                    begin, end = meta["data_offsets"]
                    tensors[name] = TensorEntry(
                        name=name,
                        file=shard,
                        dtype=meta["dtype"],
                        shape=tuple(meta["shape"]),
                        start=data_start + begin,
                        end=data_start + end,
                    )
            self._check_index_against(tensors)
            self._tensors = tensors
        return self._tensors

    def _check_index_against(self, tensors: dict[str, TensorEntry]) -> None:
        """Every tensor the index places in a shard is in that shard."""
        for name, shard in (self._index_weight_map() or {}).items():
            entry = tensors.get(name)
            if entry is None or entry.file != self.directory / shard:
                found = "no such tensor" if entry is None else f"it is in {entry.file.name}"
                raise CheckpointError(f"{self.index_path}: weight_map -> {name}: expected in {shard}, found {found}")

    def select(self, prefixes: tuple[str, ...]) -> dict[str, TensorEntry]:
        """Tensors whose names start with one of ``prefixes``; an empty selection is an error."""
        # Once per prefixes: a matrix of thousands of artifacts selects from one checkpoint.
        if prefixes in self._selections:
            return dict(self._selections[prefixes])
        selected = {name: entry for name, entry in self.tensors.items() if name.startswith(prefixes)}
        if not selected:
            raise CheckpointError(
                f"{self.label}: no tensors named {' or '.join(p + '*' for p in prefixes)} in "
                f"{self.directory} ({len(self.tensors)} tensors in "
                f"{', '.join(path.name for path in self.shard_files())})"
            )
        self._selections[prefixes] = dict(sorted(selected.items()))
        return dict(self._selections[prefixes])

    @staticmethod
    def check_float_tensors(entries: dict[str, TensorEntry]) -> None:
        """Refuse tensors a model takes as floating point but the checkpoint stores as
        integers, booleans or packed floats: ``load(dtype=...)`` would convert them
        without a word."""
        for entry in entries.values():
            if entry.dtype not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{entry.file}: tensor '{entry.name}': expected a floating-point dtype "
                    f"({', '.join(FLOAT_DTYPES)}), found {entry.dtype}"
                )

    def load(
        self,
        entries: dict[str, TensorEntry],
        strip_prefix: str = "",
        dtype: Any = None,
        owned: bool = False,
        replaced: Callable[[str], bool] | None = None,
    ) -> dict[str, Any]:
        """Read exactly ``entries`` through ``safe_open``.

        By default the tensors are views of a private file mapping: nothing is
        read until used, which suits read-only use. ``owned=True`` gives each
        tensor memory of its own, for callers that rewrite weights: writing into
        the mapping costs a copy-on-write fault per 4 KiB page, and pages read
        through it stay resident for as long as any tensor of the file lives.
        Each tensor is then read through a mapping that is closed right after,
        so the process never holds the file and the copies at once.

        ``replaced`` (with ``owned``): the names (as returned, ``strip_prefix``
        stripped) of tensors the caller will swap for new ones instead of writing
        into. They are not copied: each stays a view of a mapping of its own, which
        goes when the tensor does, so the peak is the same as with copies, without
        the copying (a GPTQ build's linear weights: 2 to 5 s for so400m's 1.6 GB on
        the test machine, against 0.2 s). Written into after all, a view costs a
        copy-on-write fault per page and changes nothing on disk.
        """
        by_file: dict[Path, list[str]] = {}
        for name, entry in entries.items():
            by_file.setdefault(entry.file, []).append(name)
        self.tensors_read.update(entries)
        state: dict[str, Any] = {}

        def keep(name: str, tensor: Any) -> None:
            key = name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name
            converted = tensor.to(dtype) if dtype is not None else tensor
            copy = owned and converted is tensor and not (replaced is not None and replaced(key))
            state[key] = converted.clone() if copy else converted

        for path, names in by_file.items():
            # One mapping per tensor when owned (see above), else one per file.
            groups = [[name] for name in names] if owned else [names]
            for group in groups:
                with _open_shard(path) as handle:
                    for name in group:
                        keep(name, _read_tensor(handle, path, name))
        return state
