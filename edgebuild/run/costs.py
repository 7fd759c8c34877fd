"""What an artifact cost to build and verify, as recorded: seconds and peak memory.

Two places keep it:

- the lock file: each entry's ``cost`` (``build_seconds``, ``verify_seconds``,
  ``peak_rss_bytes``), rounded to two significant figures so that a rebuild's
  jitter rarely shows in its diff. Committed with the manifest, it is the same in
  every checkout of a commit, which is what shards need: every CI shard job must
  compute the same partition, or an artifact falls between two shards. So shards read
  the lock file as committed at ``HEAD`` (:func:`committed_costs`), never the copy a
  run in this checkout rewrote;
- the build record (``build_seconds``, ``build_info.peak_rss_bytes``: the peak of
  the worker process that built it) and the report (``metrics.verify_seconds``)
  beside a local build, for an artifact the lock file does not list.

History is kept by artifact name, whatever the fingerprint: an artifact whose
parameters changed costs about what it cost before, a better guess than none.
Shards are balanced by it (``shards.py``); cluster tasks are sized by it (``executors/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

LOCK_SOURCE = "lock file"
RECORD_SOURCE = "build record"


@dataclass(frozen=True)
class Cost:
    build_seconds: float | None
    verify_seconds: float | None
    peak_rss_bytes: int | None
    source: str

    def seconds(self, verify: bool) -> float | None:
        """Wall time of a build, plus its verification when ``verify``; ``None`` unknown."""
        if self.build_seconds is None:
            return None
        return self.build_seconds + ((self.verify_seconds or 0.0) if verify else 0.0)


def recorded_costs(workspace: "Workspace", names: list[str]) -> dict[str, Cost | None]:
    """The recorded cost of each of ``names``: the lock file's, else the local build's; ``None``
    when neither has one. An unreadable lock file counts as none (a cost is a hint)."""
    from edgebuild.errors import LockfileError
    from edgebuild.core.lock_format import read_lock

    try:
        locked = read_lock(workspace.lock_path)
    except LockfileError:
        locked = {}
    costs: dict[str, Cost | None] = {}
    for name in names:
        costs[name] = _from_lock(locked.get(name)) or _from_build(workspace, name)
    return costs


def committed_costs(workspace: "Workspace", names: list[str]) -> tuple[dict[str, Cost | None], str | None]:
    """The cost of each of ``names`` in the lock file as committed at ``HEAD`` -- what every
    checkout of the commit sees alike, whatever was built or recorded in it since -- and,
    when there is none to read, why (outside a git work tree, the lock file not committed,
    or unreadable as committed: then no artifact has a cost)."""
    from edgebuild.core.files import LOCK_BYTES
    from edgebuild.core.lock_format import parse_lock
    from edgebuild.errors import LockfileError
    from edgebuild.run.vcs import committed_bytes

    committed = committed_bytes(workspace.lock_path, LOCK_BYTES)
    if committed is None:
        return {name: None for name in names}, f"{workspace.lock_path.name} is not committed"
    try:
        locked = parse_lock(committed, f"{workspace.lock_path.name} at HEAD")
    except LockfileError:
        return {name: None for name in names}, f"{workspace.lock_path.name} at HEAD is not a lock file"
    return {name: _from_lock(locked.get(name)) for name in names}, None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _from_lock(entry: Any) -> Cost | None:
    cost = entry.get("cost") if isinstance(entry, dict) else None
    if not isinstance(cost, dict) or _number(cost.get("build_seconds")) is None:
        return None
    peak = _number(cost.get("peak_rss_bytes"))
    return Cost(_number(cost.get("build_seconds")), _number(cost.get("verify_seconds")),
                int(peak) if peak is not None else None, LOCK_SOURCE)


def _from_build(workspace: "Workspace", name: str) -> Cost | None:
    from edgebuild.core.record import read_record_or_none
    from edgebuild.core.report import read_report
    from edgebuild.run.lockfile import lock_cost

    directory = workspace.layout.artifact_dir(name)
    record = read_record_or_none(directory)
    if record is None or record.build_seconds is None:
        return None
    cost = lock_cost(record, read_report(directory))
    return Cost(record.build_seconds, cost["verify_seconds"], record.build_info.get("peak_rss_bytes"), RECORD_SOURCE)
