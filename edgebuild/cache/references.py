"""The float model's outputs on given inputs, kept by content: ``cache/references/<key>.safetensors``.

The key is a digest of what the outputs are a function of -- the float model (its
checkpoint's bytes as the chain's root reads them, its parameters, the code that runs
it, the torch and transformers versions) and the inputs' bytes -- so judging an artifact
again after a threshold changed, or after an upgrade of the artifact's own runtime,
runs only the artifact's side. Local only (never pulled from a remote): a file whose
bytes do not match the digest it carries is named, thrown away and computed again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from edgebuild.core.atomic import write_bytes
from edgebuild.core.files import UnreadableFile, read_bytes

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy

    from edgebuild.core.runner import Outputs

REFERENCES_DIR = "references"
FORMAT = "1"
# Outputs of a float model on a dataset: tokens x hidden x samples, float32. Far above a
# few hundred samples of a full-size tower, far below what hurts a machine.
REFERENCE_BYTES = 16 << 30


class References:
    """Float outputs by key, in ``directory``."""

    def __init__(self, directory: Path, log: Callable[[str], None]) -> None:
        self.directory = directory
        self.log = log

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    def get(self, key: str) -> "list[Outputs] | None":
        """The outputs kept under ``key``; ``None`` when there are none (or they are damaged: said)."""
        from safetensors.numpy import load

        path = self.path(key)
        try:
            data = read_bytes(path, REFERENCE_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, UnreadableFile) as error:
            self.log(f"{path}: unreadable float reference ({error}); computing it again")
            return None
        try:
            metadata = json.loads(data[8:8 + int.from_bytes(data[:8], "little")]).get("__metadata__", {})
            tensors = load(data)
        except Exception as error:  # safetensors raises its own SafetensorError; JSON, struct
            self.log(f"{path}: damaged float reference ({type(error).__name__}); computing it again")
            return None
        if metadata.get("format") != FORMAT or metadata.get("content") != _content_digest(tensors):
            self.log(f"{path}: its tensors do not match the digest it was written with (a damaged disk, or an edit); "
                      "computing the float reference again")
            return None
        samples: list[Outputs] = [{} for _ in range(int(metadata["samples"]))]
        for name, tensor in tensors.items():
            index, output = name.split("/", 1)
            samples[int(index)][output] = tensor
        return samples

    def put(self, key: str, outputs: "list[Outputs]") -> None:
        from safetensors.numpy import save

        tensors = {f"{index}/{name}": value for index, sample in enumerate(outputs) for name, value in sample.items()}
        metadata = {"format": FORMAT, "samples": str(len(outputs)), "content": _content_digest(tensors)}
        self.directory.mkdir(parents=True, exist_ok=True)
        write_bytes(self.path(key), save(tensors, metadata=metadata))


def _content_digest(tensors: dict) -> str:
    return digest_arrays((name, tensors[name]) for name in sorted(tensors))


def digest_arrays(arrays: "Iterable[tuple[str, numpy.ndarray]]") -> str:
    """Digest of named arrays (``(name, array)`` pairs, in the order given): each one's
    name, dtype, shape and bytes, so that the same values under another name, type or
    shape digest differently. (Here, not in ``core/hashing.py``, which builds' code
    digests cover: judging code changes nothing a build makes.)"""
    import blake3

    hasher = blake3.blake3()
    for name, array in arrays:
        hasher.update(f"{name}\0{array.dtype}\0{list(array.shape)}\0".encode())
        # Contiguous arrays are hashed in place, not copied (a float model's outputs on a dataset).
        hasher.update(array.reshape(-1).view("uint8") if array.flags.c_contiguous else array.tobytes())
    return hasher.hexdigest()
