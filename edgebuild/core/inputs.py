"""Input files named in the manifest: paths or globs, relative to the manifest's directory."""

from __future__ import annotations

import glob
from pathlib import Path

from edgebuild.errors import CheckpointError


def expand_inputs(patterns: list[str], root: Path, what: str) -> list[Path]:
    """Every file the patterns name, each pattern's matches sorted; a pattern that
    matches nothing is an error (a typo must not silently drop calibration data)."""
    paths: list[Path] = []
    for pattern in patterns:
        full = pattern if Path(pattern).expanduser().is_absolute() else str(root / pattern)
        matches = sorted(Path(match) for match in glob.glob(str(Path(full).expanduser())) if Path(match).is_file())
        if not matches:
            raise CheckpointError(f"{what}: {pattern!r} matches no file (relative to {root})")
        paths.extend(matches)
    return paths
