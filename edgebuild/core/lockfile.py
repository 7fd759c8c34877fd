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
from edgebuild.errors import LockfileError

LOCK_FORMAT = 1


def read_lock(path: Path) -> dict[str, Any]:
    """The artifacts of the lock file at ``path`` (empty when there is none)."""
    shown = shown_path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError) as error:
        raise LockfileError(f"{shown}: not valid JSON ({error}); delete it and run `doit build` to write it afresh") from None
    if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT or not isinstance(data.get("artifacts"), dict):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise LockfileError(
            f"{shown}: expected a lock file of format {LOCK_FORMAT}, found format {found!r}; "
            "delete it and run `doit build` to write it afresh"
        )
    return data["artifacts"]


def render_lock(artifacts: dict[str, Any]) -> str:
    return json.dumps({"format": LOCK_FORMAT, "artifacts": artifacts}, indent=2, sort_keys=True) + "\n"
