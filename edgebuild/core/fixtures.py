"""Tiny checkpoints of the real architectures, generated deterministically.

No model hub is reachable from the machines this runs on, so the default
manifest and the tests build from checkpoints generated here. Each is a
:class:`~edgebuild.core.kind.Fixture` that a kind declares (its ``fixtures`` hook:
the kind owns its architecture's checkpoints); a manifest names one with
``fixture: NAME`` and adjusts its config with ``fixture_config``.

A generated checkpoint lives under ``cache/fixtures/<name>-<key>/``, keyed by
everything that decides its bytes: the full config, the seed, and the code of the
module whose function writes it. It is written into a temporary directory and
renamed into place, so nobody ever reads half of one.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any

from edgebuild.core.atomic import new_directory
from edgebuild.core.files import describe_entry
from edgebuild.core.kind import Fixture
from edgebuild.errors import FilesystemError, ManifestError

FIXTURE_FORMAT = 2

# Fixtures exist to be generated in seconds: a size or count past this is not tiny
# (and 10**23 layers would never finish).
MAX_FIXTURE_INTEGER = 4096


def check_overrides(defaults: dict[str, Any], overrides: dict[str, Any], path: tuple[str, ...] = ()) -> None:
    """An override of a default must be of the default's type; integers (sizes and
    counts; token ids may be 0) within reason. New keys pass through to the config."""
    for key, value in overrides.items():
        where = " -> ".join(("fixture_config", *path, str(key)))
        if key not in defaults:
            continue
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ManifestError(f"{where}: expected a mapping, found {value!r}")
            check_overrides(default, value, (*path, str(key)))
        elif isinstance(default, int) and not isinstance(default, bool):
            minimum = 0 if str(key).endswith("_id") else 1
            if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_FIXTURE_INTEGER:
                raise ManifestError(f"{where}: expected an integer from {minimum} to {MAX_FIXTURE_INTEGER}, found {value!r}")
        elif type(value) is not type(default):
            raise ManifestError(f"{where}: expected a {type(default).__name__}, found {value!r}")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def redraw_weights(state: dict[str, Any], seed: int, *, uneven_norms: bool = False) -> dict[str, Any]:
    """Deterministic values by role: weights ~ N(0, 1/fan_in), norms near 1, small biases.

    With ``uneven_norms`` LayerNorm scales span about two orders of magnitude,
    so that activation-aware equalization has something to balance.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    redrawn = {}
    for name in sorted(state):
        tensor = state[name]
        shape = tuple(tensor.shape)
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        is_norm = "norm" in name.lower()
        if is_norm and leaf == "weight":
            if uneven_norms:
                value = torch.exp2(noise.clamp(-3, 3) * 1.5)
            else:
                value = 1.0 + 0.2 * noise
        elif leaf == "bias" or is_norm:
            value = 0.05 * noise
        elif len(shape) >= 2:
            fan_in = 1
            for size in shape[1:]:
                fan_in *= size
            value = noise / (fan_in ** 0.5)
        else:
            value = 0.5 * noise
        redrawn[name] = value.to(tensor.dtype)
    return redrawn



def fixture(name: str) -> Fixture:
    """The fixture ``name``, from whichever kind declares it; a :class:`ManifestError`
    listing the known ones (with a close match) when none does."""
    from edgebuild.core.registry import find_fixture

    found, known = find_fixture(name)
    if found is None:
        import difflib

        match = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise ManifestError(f"fixture: unknown fixture {name!r}; expected one of {', '.join(map(repr, known))}{hint}")
    return found


def fixture_directory(cache_dir: Path, name: str, overrides: dict[str, Any], seed: int = 0) -> Path:
    """The directory a fixture with these overrides lives in, keyed by everything that
    decides its bytes: the full config (defaults included), the seed, and the code of
    the module that writes it. Two configurations never share a directory, and a
    changed generator never serves a stale one."""
    generator = fixture(name)
    key = json.dumps(
        {
            "format": FIXTURE_FORMAT,
            "name": name,
            "config": _merge(generator.defaults, overrides),
            "seed": seed,
            "code": hashlib.sha256(Path(inspect.getsourcefile(generator.write) or "").read_bytes()).hexdigest(),
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "fixtures" / f"{name}-{digest}"


def ensure_fixture(cache_dir: Path, name: str, overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """Generate the fixture unless it already exists; return its directory.

    Written into a temporary directory and renamed into place, so a reader
    never sees half a checkpoint, and two processes racing both end up with
    one complete copy.
    """
    overrides = overrides or {}
    generator = fixture(name)
    check_overrides(generator.defaults, overrides)
    target = fixture_directory(cache_dir, name, overrides, seed)
    if target.is_dir():
        return target
    with new_directory(target, target.parent / ".tmp", replace=False) as scratch:
        generator.write(scratch, _merge(generator.defaults, overrides), seed)
    return target


def write_fixture(directory: Path, name: str, overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """Write a fixture into ``directory``, a new or empty one (for tests and users who want
    a copy to edit): written beside it and renamed into place, so nothing that was there
    is overwritten and nothing is written through a link (``edgebuild/core/files.py``)."""
    generator = fixture(name)
    if os.path.islink(directory):
        raise FilesystemError(f"{directory}: {describe_entry(directory, os.lstat(directory).st_mode)}; expected a new "
                              "or empty directory to write the fixture into (never through a link)")
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise FilesystemError(f"{directory}: exists and is not an empty directory; expected a new or empty directory "
                              "to write the fixture into")
    directory.parent.mkdir(parents=True, exist_ok=True)
    with new_directory(directory, directory.parent) as scratch:
        generator.write(scratch, _merge(generator.defaults, overrides or {}), seed)
    return directory
