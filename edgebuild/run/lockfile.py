"""The lock file: what each built artifact is, meant to be committed.

It sits beside the manifest and is named after it (``artifacts.yaml`` ->
``artifacts.lock``). For every artifact built at its current fingerprint it
records that fingerprint, the fingerprints of the inputs it read, where its
checkpoints come from (the Hugging Face repo, commit and file etags of an ``hf:``
checkpoint), its parameters, the code and tool versions, the size and digest of
each output file, whether it verified, and what building and verifying it
cost (seconds and peak memory, rounded to two significant figures: CI shards
are balanced by them). A reviewer reads an artifact's change
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

import json
import math
from pathlib import Path
from typing import Any

from edgebuild.core.atomic import write_text
from edgebuild.core.console import shown_path
from edgebuild.errors import EdgebuildError, FilesystemError, LockfileError
from edgebuild.core.fingerprint import locked
from edgebuild.core.project import Project
from edgebuild.core.record import BuildRecord, VerificationState, read_record_or_none, verification_state
from edgebuild.core.report import read_report

LOCK_FORMAT = 1


def lock_entry(project: Project, name: str) -> dict[str, Any] | None:
    """The entry of ``name``; ``None`` when it is not built at its current fingerprint."""
    try:
        state = verification_state(project, name)
        if state is VerificationState.NOT_BUILT:
            return None
        verify_fingerprint = project.verify_fingerprint(name)
    except EdgebuildError:
        return None
    record = read_record_or_none(project.layout.artifact_dir(name))
    if record is None:
        return None
    # true / false: verified against the current thresholds, passed or failed; null: not verified.
    verified = {VerificationState.VERIFIED: True, VerificationState.FAILED: False}.get(state)
    return record.to_json(only=("kind", "fingerprint", "inputs", "params", "code", "versions", "outputs")) | {
        # Where the checkpoints come from now (a Hugging Face repo and commit); the built
        # record may have been pulled from a machine that read the same bytes elsewhere.
        "checkpoint_origins": project.record(name).to_json(only=("checkpoint_origins",))["checkpoint_origins"],
        "verify_code": project.verify_code(name),
        "verified": verified,
        "verify_fingerprint": verify_fingerprint if verified is not None else None,
        # What the build and its verification cost (edgebuild/costs.py): CI shards are
        # balanced by it, cluster tasks sized by it.
        "cost": lock_cost(record, read_report(project.layout.artifact_dir(name)) if verified is not None else None),
    }


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


def update_lock(project: Project, names: list[str]) -> bool:
    """Refresh the entries of those of ``names`` that are built at their current
    fingerprint (the others keep theirs); ``True`` when the file changed."""
    path = project.lock_path
    with locked(project.layout.mutex(path.name)):
        artifacts = {name: entry for name, entry in read_lock(path).items() if name in project.manifest.artifacts}
        for name in names:
            entry = lock_entry(project, name)
            if entry is not None:
                artifacts[name] = entry
        text = render_lock(artifacts)
        try:
            if path.read_text(encoding="utf-8") == text:
                return False
        except FileNotFoundError:
            pass
        try:
            write_text(path, text)
        except OSError as error:
            raise FilesystemError.of(error, path, "cannot write the lock file") from None
        return True
