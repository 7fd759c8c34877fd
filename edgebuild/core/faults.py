"""Fault points: where a test makes edgebuild fail on purpose, to check what a
crash at that instant leaves behind (a deterministic stand-in for a timing race).

``EDGEBUILD_FAULT=<point>=<action>`` arms one point; unset, every point is a
no-op. Actions:

- ``kill``: SIGKILL this process, so no ``finally`` block or cleanup runs (a
  killed CI runner, an out-of-memory kill);
- ``interrupt``: SIGINT, as Ctrl-C would (Python raises ``KeyboardInterrupt``);
- ``raise``: raise :class:`InjectedFault`, an unexpected error, so cleanup runs;
- ``stall``: say so on stderr, then sleep (``EDGEBUILD_FAULT_STALL_SECONDS``, default
  600): a build that hangs, for a test to kill its machine in the middle of it.

Points:

- ``build.before_record``: the kind wrote every output into the scratch
  directory; the record is not written.
- ``build.before_rename``: the complete scratch directory, record included, is
  not yet renamed into ``build/<name>/``.
- ``store.before_rename``: a store entry's blobs are in place, the entry that
  names them is not yet written.
- ``verify.after_report``: the report is written; the build is not yet kept in
  the store with it, nor pushed.
- ``publish.after_files``: every file of a published entry is written, the
  step that makes the entry appear (a directory rename, or ``SHA256SUMS`` on an
  object store) is not.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from edgebuild.core.config import FAULT_VARIABLE as FAULT_ENV, armed_fault


class InjectedFault(RuntimeError):
    """What a point armed with ``raise`` raises. Deliberately not an
    :class:`~edgebuild.errors.EdgebuildError`: it stands for a crash or a bug, which
    the CLI reports with a traceback, not for a failure edgebuild explains."""


def fault_point(name: str) -> None:
    """Fail here if ``EDGEBUILD_FAULT`` arms the point ``name``; otherwise do nothing."""
    point, action, stall_seconds = armed_fault()
    spec = f"{point}={action}"
    if point != name:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "interrupt":
        # As Ctrl-C in a terminal would, whatever this process inherited: a shell's
        # ``cmd &`` or ``nohup`` starts it with SIGINT ignored, and then the signal would
        # be dropped and the build would go on.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), signal.SIGINT)
        return
    if action == "raise":
        raise InjectedFault(f"{FAULT_ENV}={spec}")
    if action == "stall":
        print(f"fault: stalling at {point} (pid {os.getpid()})", file=sys.stderr, flush=True)
        time.sleep(stall_seconds)
        return
    raise InjectedFault(f"{FAULT_ENV}={spec}: the action must be 'kill', 'interrupt', 'raise' or 'stall'")
