"""Digests of bytes, canonical JSON and whole files: the hash every fingerprint,
record and remote key is made of (blake3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import blake3

HASH_NAME = "blake3"
# blake3's digest, as lowercase hex: the only shape a digest read from anywhere may have.
DIGEST_HEX_LENGTH = 64
READ_CHUNK = 16 * 1024 * 1024


def digest_bytes(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def digest_json(value: Any) -> str:
    return digest_bytes(canonical_json(value).encode())


def file_digest(path: Path) -> str:
    """Digest of a whole file, read now (outputs are checked against their recorded digests)."""
    hasher = blake3.blake3()
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def is_digest(value: Any) -> bool:
    """Whether ``value`` has the shape of a digest (lowercase hex of the right length)."""
    return (
        isinstance(value, str)
        and len(value) == DIGEST_HEX_LENGTH
        and all(character in "0123456789abcdef" for character in value)
    )
