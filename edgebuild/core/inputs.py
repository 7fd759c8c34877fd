"""Input files named in the manifest: paths or globs, relative to the manifest's directory."""

from __future__ import annotations

import glob
import os
import stat
from pathlib import Path

from edgebuild.errors import CheckpointError


def expand_inputs(patterns: list[str], root: Path, what: str) -> list[Path]:
    """Every file the patterns name, each pattern's matches sorted; a pattern that
    matches nothing is an error (a typo must not silently drop calibration data), and so
    is a match that is not a readable regular file (a dangling symlink among the images
    must not calibrate on three of four). Directories a wildcard matches are passed over:
    ``images/*`` names the files in ``images``."""
    paths: list[Path] = []
    for pattern in patterns:
        full = pattern if Path(pattern).expanduser().is_absolute() else str(root / pattern)
        wildcard = glob.has_magic(pattern)
        matches = []
        for match in sorted(Path(found) for found in glob.glob(str(Path(full).expanduser()))):
            problem = _unreadable(match)
            if problem == "a directory" and wildcard:
                continue
            if problem is not None:
                raise CheckpointError(f"{what}: {pattern!r} matches {match}, {problem}; expected a readable file")
            matches.append(match)
        if not matches:
            raise CheckpointError(f"{what}: {pattern!r} matches no file (relative to {root})")
        paths.extend(matches)
    return paths


def _unreadable(path: Path) -> str | None:
    """Why ``path`` is not a readable regular file, or ``None`` when it is one."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a symlink to nothing" if os.path.islink(path) else "which does not exist"
    except OSError as error:
        return f"which cannot be read ({error.strerror})"
    if stat.S_ISDIR(mode):
        return "a directory"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    if not os.access(path, os.R_OK):
        return "which cannot be read (permission denied)"
    return None
