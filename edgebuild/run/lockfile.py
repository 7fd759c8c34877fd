"""The lock file: what each built artifact is, meant to be committed (its format and
reading: ``edgebuild/core/lock_format.py``; refreshing it: here).

It sits beside the manifest and is named after it (``artifacts.yaml`` ->
``artifacts.lock``). For every artifact built at its current fingerprint it
records that fingerprint, the fingerprints of the inputs it read, where its
checkpoints come from (the Hugging Face repo, commit and file etags of an ``hf:``
checkpoint), its parameters, the code and tool versions, the size and digest of
each output file, whether it verified, and what building and verifying it
cost (seconds and peak memory, rounded to two significant figures, and rewritten only
when they move by more than a factor of 1.5: CI shards are balanced by them, and a
rebuild on another runner must not show in the diff). A reviewer reads an artifact's change
in the diff of this file (an input changed, a tool was upgraded, an output's bytes
moved), and anyone can check a file in ``build/`` against it.

It records only what happened: ``doit build`` and ``doit verify`` refresh the
entries of the artifacts they ran (and what those depend on) that are now built
at their current fingerprint. An artifact whose build failed, or was not run,
keeps the entry it had (its old build is what ``build/`` still holds) and gets
none if it had none. Entries of artifacts no longer in the manifest are
dropped. It holds no timestamps, so an unchanged build leaves it byte for byte
unchanged (its costs come from the build's record, which a restore or a pull
brings back as it was).
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from edgebuild.core.atomic import write_text
from edgebuild.core.files import LOCK_BYTES, UnreadableFile, read_text
from edgebuild.core.files import locked
from edgebuild.core.lock_format import read_lock, render_lock
from edgebuild.core.project import Artifact
from edgebuild.core.record import BuildRecord, read_record_or_none
from edgebuild.core.report import read_report
from edgebuild.errors import EdgebuildError, FilesystemError, LockfileError
from edgebuild.run.state import VerificationState, verification_state

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace



def lock_entry(workspace: "Workspace", artifact: "Artifact") -> dict[str, Any] | None:
    """The entry of ``artifact``; ``None`` when it is not built at its current fingerprint."""
    try:
        state = verification_state(workspace, artifact)
        if state is VerificationState.NOT_BUILT:
            return None
        verify_fingerprint = artifact.verify_fingerprint
    except EdgebuildError:
        return None
    record = read_record_or_none(artifact.directory)
    if record is None:
        return None
    # true / false: verified against the current thresholds, passed or failed; null: not verified.
    verified = {VerificationState.VERIFIED: True, VerificationState.FAILED: False}.get(state)
    return record.to_json(only=("kind", "fingerprint", "inputs", "params", "code", "versions", "outputs")) | {
        # The paths of the input files and the names of the sources, as the manifest names
        # them: `doit diff` against a commit says "calibration: images/c.png added", not
        # "file 3 changed". (Not the checkpoints' labels: they hold this machine's paths.)
        "inputs_named": lock_names(artifact),
        # Where the checkpoints come from now (a Hugging Face repo and commit); the built
        # record may have been pulled from a machine that read the same bytes elsewhere.
        "checkpoint_origins": artifact.record.to_json(only=("checkpoint_origins",))["checkpoint_origins"],
        # The checkpoints' config leaves, for `doit diff` to name a changed key.
        "config_values": artifact.record.config_values,
        "verify_code": workspace.verify_code(artifact),
        # What it is judged with: the thresholds, and a digest of each other part of its
        # verification fingerprint (`doit diff` names the part that changed).
        "verify": artifact.params.verify_parameters(),
        "verify_parts": workspace.verify_parts(artifact),
        "verified": verified,
        "verify_fingerprint": verify_fingerprint if verified is not None else None,
        # What the build and its verification cost (edgebuild/costs.py): CI shards are
        # balanced by it, cluster tasks sized by it.
        "cost": lock_cost(record, read_report(artifact.directory) if verified is not None else None),
    }


def lock_names(artifact: Artifact) -> dict[str, Any]:
    """What the manifest names each input of ``artifact``, as a file others read keeps it:
    input files' paths and sources' names, not the checkpoints' labels (this machine's paths)."""
    return {role: named for role, named in artifact.record.inputs_named.items() if not role.startswith("checkpoint")}


def significant(value: float | None, digits: int = 2) -> float | None:
    """``value`` rounded to ``digits`` significant figures (12.34 -> 12.0, 0.0456 -> 0.046)."""
    if value is None or value <= 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(value))))


def lock_cost(record: BuildRecord, report: dict[str, Any] | None) -> dict[str, Any]:
    """The ``cost`` of a lock entry, from the build's record and its report."""
    peak = record.build_info.get("peak_rss_bytes")
    verify_seconds = (report or {}).get("metrics", {}).get("verify_seconds")
    return {
        "build_seconds": significant(record.build_seconds),
        "verify_seconds": significant(verify_seconds) if isinstance(verify_seconds, (int, float)) else None,
        "peak_rss_bytes": int(significant(float(peak))) if isinstance(peak, (int, float)) and peak > 0 else None,
    }


# A cost is rewritten only when it moved by more than this factor: the same build on
# another runner takes other seconds, and a no-op CI run must leave the file unchanged.
COST_TOLERANCE = 1.5


def steady_cost(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after``, but each figure within :data:`COST_TOLERANCE` of ``before``'s kept as it was."""
    steady = dict(after)
    for key, value in after.items():
        old = before.get(key)
        numbers = all(isinstance(item, (int, float)) and not isinstance(item, bool) and item > 0 for item in (old, value))
        if numbers and max(old, value) <= COST_TOLERANCE * min(old, value):
            steady[key] = old
    return steady


def update_lock(workspace: "Workspace", artifacts: list[Artifact]) -> bool:
    """Refresh the entries of those of ``artifacts`` that are built at their current
    fingerprint (the others keep theirs); ``True`` when the file changed."""
    path = workspace.lock_path
    with _mutex(workspace, path):
        entries = {name: entry for name, entry in read_lock(path).items() if name in workspace.manifest.artifacts}
        for artifact in artifacts:
            entry = lock_entry(workspace, artifact)
            if entry is not None:
                before = entries.get(artifact.name)
                if isinstance(before, dict) and isinstance(before.get("cost"), dict):
                    entry["cost"] = steady_cost(before["cost"], entry["cost"])
                entries[artifact.name] = entry
        text = render_lock(entries)
        try:
            if read_text(path, LOCK_BYTES) == text:
                return False
        except (OSError, UnreadableFile):
            pass  # missing, or not ours to compare: written anew (read_lock refused anything unreadable)
        try:
            write_text(path, text)
        except OSError as error:
            raise FilesystemError.of(error, path, "cannot write the lock file") from None
        return True


@contextmanager
def _mutex(workspace: "Workspace", path: Path) -> Iterator[None]:
    """The mutex of the lock file's writers; one line naming it where it cannot be had (a
    read-only cache/ that lacks it), not a traceback."""
    mutex = workspace.layout.mutex(path.name)
    with ExitStack() as held:
        try:
            held.enter_context(locked(mutex))
        except OSError as error:
            raise FilesystemError.of(error, mutex, f"cannot take the mutex of {path.name}'s writers") from None
        yield


def merge_shard_locks(committed: dict[str, Any], shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The lock file one run of every shard would have written, from the committed one and
    the lock file each shard wrote (each the committed lock with the entries of its own
    artifacts refreshed, and entries of artifacts no longer in the manifest dropped): each
    artifact's entry from the shard that changed it, the committed one where none did.
    :class:`LockfileError` when two shards wrote the same artifact differently."""
    merged: dict[str, Any] = {}
    for name in sorted(set(committed).union(*shards)):
        before = committed.get(name)
        written = {render_lock({name: lock.get(name)}): lock.get(name) for lock in shards if lock.get(name) != before}
        if len(written) > 1:
            raise LockfileError(f"{name}: two shards wrote different lock entries for it; each artifact is built by one shard")
        entry = next(iter(written.values())) if written else before
        if entry is not None:
            merged[name] = entry
    return merged


def lock_changes(committed: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The artifacts whose entries differ between two lock files' artifacts, costs aside (a
    build on another machine costs other seconds; what it is does not change)."""

    def what(entry: Any) -> Any:
        return {key: value for key, value in entry.items() if key != "cost"} if isinstance(entry, dict) else entry

    return sorted(name for name in set(committed) | set(current) if what(committed.get(name)) != what(current.get(name)))



def rebuilt_with_other_bytes(before: Any, after: Any) -> list[str]:
    """The output files of two entries of one artifact that differ only in their bytes --
    the same fingerprint, built again, wrote other bytes: a build that is not byte for byte
    reproducible -- else ``[]``."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return []
    keys = {key for key in set(before) | set(after) if key != "cost" and before.get(key) != after.get(key)}
    if keys != {"outputs"} or not isinstance(before["outputs"], dict) or not isinstance(after.get("outputs"), dict):
        return []
    return sorted(file for file in set(before["outputs"]) | set(after["outputs"])
                  if before["outputs"].get(file) != after["outputs"].get(file))


def lock_change_described(committed: dict[str, Any], current: dict[str, Any], name: str) -> str:
    """``name`` and what differs in its entry between two lock files' artifacts, costs
    aside, as the lock job's message names it: ``qdq (fingerprint, params)``, ``a (new)``,
    ``t (same fingerprint 1a2b3c4d5e6f, other bytes of model.bin)``."""
    before, after = committed.get(name), current.get(name)
    if not isinstance(before, dict) or not isinstance(after, dict):
        return f"{name} ({'new' if not isinstance(before, dict) else 'no longer in the manifest'})"
    other_bytes = rebuilt_with_other_bytes(before, after)
    if other_bytes:
        return f"{name} (same fingerprint {str(after.get('fingerprint'))[:12]}, other bytes of {', '.join(other_bytes)})"
    return f"{name} ({', '.join(sorted(key for key in set(before) | set(after) if key != 'cost' and before.get(key) != after.get(key)))})"
