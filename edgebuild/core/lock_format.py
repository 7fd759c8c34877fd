"""The lock file's format: reading it and writing its text (what goes into an entry,
and when, is ``edgebuild/run/lockfile.py``).

``<manifest stem>.lock`` is JSON: ``{"format": 1, "artifacts": {name: entry}}``,
keys sorted, two-space indents, so that a no-op leaves it byte for byte unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgebuild.core.console import shown_path
from edgebuild.core.files import LOCK_BYTES, UnreadableFile, parse_json, read_text
from edgebuild.errors import LockfileError

LOCK_FORMAT = 1


def read_lock(path: Path) -> dict[str, Any]:
    """The artifacts of the lock file at ``path`` (empty when there is none)."""
    shown = shown_path(path)
    try:
        text = read_text(path, LOCK_BYTES)
    except FileNotFoundError:
        return {}
    except UnreadableFile as error:
        raise LockfileError(f"{shown}: {error}; expected a JSON lock file (delete it and run `doit build` to write it afresh)") from None
    except OSError as error:
        raise LockfileError(f"{shown}: cannot read the lock file: {error.strerror}") from None
    return parse_lock(text, shown)


def parse_lock(text: str | bytes, shown: str) -> dict[str, Any]:
    """The artifacts of a lock file's text; :class:`LockfileError` naming ``shown``."""
    try:
        data = parse_json(text)
    except UnreadableFile as error:
        raise LockfileError(f"{shown}: {error}; expected a JSON lock file (delete it and run `doit build` to write it afresh)") from None
    if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT or not isinstance(data.get("artifacts"), dict):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise LockfileError(
            f"{shown}: expected a lock file of format {LOCK_FORMAT}, found format {found!r}; "
            "delete it and run `doit build` to write it afresh"
        )
    return data["artifacts"]


def render_lock(artifacts: dict[str, Any]) -> str:
    return json.dumps({"format": LOCK_FORMAT, "artifacts": artifacts}, indent=2, sort_keys=True) + "\n"
