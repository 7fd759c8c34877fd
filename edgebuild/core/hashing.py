"""Digests of bytes, canonical JSON and whole files: the hash every fingerprint,
record and remote key is made of (blake3)."""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import blake3

from edgebuild.core.files import open_regular

HASH_NAME = "blake3"
# blake3's digest, as lowercase hex: the only shape a digest read from anywhere may have.
DIGEST_HEX_LENGTH = 64
READ_CHUNK = 16 * 1024 * 1024
# Mapped at a time by written_file_digest: a multiple of every allocation granularity.
MAPPED_WINDOW = 64 * 1024 * 1024


def digest_bytes(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def canonical_json(value: Any) -> str:
    return "".join(_CANONICAL(value, 0)) if _CANONICAL is not None else _CANONICAL_FALLBACK.encode(value)


# json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True), the same
# text, from json's own C encoder made once: ``JSONEncoder.encode`` makes one per call,
# half the time of encoding a record's parameters, and a 10,000-artifact `doit status`
# encodes 20,000 such values. Made without the circular-reference check (``markers``
# ``None``): what is hashed comes from JSON, YAML and model dumps, which hold no cycles
# (one would be a RecursionError instead of a ValueError). A Python without the C
# encoder keeps the encoder (same text).
_CANONICAL_FALLBACK = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_CANONICAL = (
    _c_make_encoder(None, _CANONICAL_FALLBACK.default, json.encoder.encode_basestring_ascii,  # type: ignore[attr-defined]
                    None, ":", ",", True, False, True)
    if _c_make_encoder is not None else None
)


def digest_json(value: Any) -> str:
    return digest_bytes(canonical_json(value).encode())


class EncodedOnce(dict):  # type: ignore[type-arg]
    """A dict that many fingerprints hold, its canonical JSON made once (``text``): the part
    of a checkpoint every artifact of a matrix reads (one entry per tensor, 40 KB of JSON
    for the Qwen3.5 tower) was encoded again for each of them, 2 s of a 10,000-artifact
    `doit status`. Not to be changed once made."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text = canonical_json(self)


def digest_json_sharing(value: dict[str, Any]) -> str:
    """:func:`digest_json` of ``value``, the same digest, where ``value`` (a dict) and the
    dicts it holds may hold :class:`EncodedOnce` values: their text is spliced in."""
    return digest_bytes(_spliced_json(value, top=True).encode())


def _spliced_json(value: dict[str, Any], top: bool) -> str:
    """``canonical_json(value)``, with the text of each :class:`EncodedOnce` value spliced in:
    at the top (a record: six keys) every value's, one level down those of a dict that holds
    one (the inputs); json's C encoder writes everything else whole, in one call per value
    (this runs once per fingerprint: a walk of every value's type cost more than the hash)."""
    for key in value:
        if type(key) is not str:
            # json writes other keys as strings, sorted as they were: not spliced.
            return canonical_json(value)
    parts = []
    for key in sorted(value):
        item = value[key]
        kind = type(item)
        if kind is EncodedOnce:
            text = item.text
        elif top and kind is dict and _holds_encoded(item):
            text = _spliced_json(item, top=False)
        else:
            text = canonical_json(item)
        # As json.dumps(sort_keys=True) writes a dict: keys in order, each as a JSON string.
        parts.append(_json_string(key) + ":" + text)
    return "{" + ",".join(parts) + "}"


def _holds_encoded(value: dict[str, Any]) -> bool:
    for item in value.values():
        if type(item) is EncodedOnce:
            return True
    return False


# A str as json.dumps(ensure_ascii=True) writes it, without the encoder's set-up per call
# (json's own C function: the same bytes).
_json_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def file_digest(path: Path) -> str:
    """Digest of a whole file, read now (outputs are checked against their recorded digests).
    A FIFO, device or directory there is an ``OSError`` at once (``files.open_regular``)."""
    hasher = blake3.blake3()
    with open_regular(path) as handle:
        while chunk := handle.read(READ_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def written_file_digest(path: Path) -> str:
    """Digest of a file this process has just written into a scratch directory of its
    own (a build's outputs), the same digest as :func:`file_digest`'s: hashed on every
    core through a mapping of 64 MiB at a time, 1.6 GB in 0.4 s instead of 1.2 s, with no
    more than one window resident (a whole-file mapping would add the file to the peak
    RSS). Only for such files: reading a mapping past a truncation by someone else kills
    the process (SIGBUS), where :func:`file_digest` would report an error."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        for offset in range(0, size, MAPPED_WINDOW):
            with mmap.mmap(handle.fileno(), min(MAPPED_WINDOW, size - offset), access=mmap.ACCESS_READ,
                           offset=offset) as window:
                hasher.update(window)
    return hasher.hexdigest()


def is_digest(value: Any) -> bool:
    """Whether ``value`` has the shape of a digest (lowercase hex of the right length)."""
    return (
        isinstance(value, str)
        and len(value) == DIGEST_HEX_LENGTH
        and all(character in "0123456789abcdef" for character in value)
    )
