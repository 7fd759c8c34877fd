"""doit's own state file, ``cache/doit.json``, kept as a cache: a command never fails for it.

doit remembers there which tasks succeeded and the values they returned; edgebuild's
fingerprints decide what is stale (``edgebuild/cli/tasks.py``), so a command loses
nothing it needs without it. doit's JSON backend stops with a traceback on a file that
is not JSON (a killed write, a full disk), and saves by truncating the file and
writing it again: in a read-only directory, or on a full disk, that ended the command
in two tracebacks (its ``open`` failing, then its ``finally`` closing a file it never
opened), after truncating the state it had. :class:`DoitState` replaces it for every
edgebuild command (:meth:`~edgebuild.cli.common.OneLineErrors.get_backends`, under
doit's own name ``json``): an unreadable file is moved aside and started afresh, a file
that cannot be written is left as it was, each said in one line, and the command goes
on with the state in memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from doit.dependency import JsonDB

from edgebuild.core.atomic import write_text
from edgebuild.core.console import say_once
from edgebuild.core.files import LOCK_BYTES, UnreadableFile, read_json

# How a line about the state file ends: why losing it costs nothing.
_DECIDED_ANYWAY = "edgebuild's fingerprints decide what is stale"


class DoitState(JsonDB):
    """doit's JSON backend, but for how the file is read and written (see the module)."""

    desc = "doit's JSON state, kept as a cache: one line instead of a traceback when it cannot be read or written"

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        # False once the file is gone on without: nothing is written to it by this process.
        self.kept = True
        self._db = self._read()

    def _read(self) -> dict[str, Any]:
        path = Path(self.name)
        try:
            # doit's own JSON: as large as a lock file, nested a few levels (doit reads it unbounded).
            state = read_json(path, LOCK_BYTES)
        except FileNotFoundError:
            return {}
        except (OSError, UnreadableFile) as error:
            self._set_aside(path, str(error.strerror) if isinstance(error, OSError) and error.strerror else str(error))
            return {}
        if not isinstance(state, dict) or not all(isinstance(value, dict) for value in state.values()):
            self._set_aside(path, "not the JSON object of tasks doit writes")
            return {}
        return state

    def _set_aside(self, path: Path, problem: str) -> None:
        aside = path.with_name(path.name + ".unreadable")
        try:
            os.replace(path, aside)
        except OSError as error:
            self.kept = False
            say_once(f"{path}: unreadable doit state ({problem}); cannot move it aside ({error.strerror}): this run's "
                     f"results are not remembered ({_DECIDED_ANYWAY})")
            return
        say_once(f"{path}: unreadable doit state ({problem}); moved to {aside.name}, starting afresh ({_DECIDED_ANYWAY})")

    def dump(self) -> None:
        """Write the state whole beside the file, then rename it over the file: the old state
        or the new one, never half of either; said in one line when it cannot be written."""
        if not self.kept:
            return
        path = Path(self.name)
        try:
            # Made here, not when the dodo file loads: the state is written when a command
            # ends, failed tasks included, and nothing else may have made cache/ by then.
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, self.codec.encode(self._db))
        except OSError as error:
            self.kept = False
            say_once(f"{path}: cannot save doit's state ({error.strerror or error}); this run's results are not "
                     f"remembered ({_DECIDED_ANYWAY})")
