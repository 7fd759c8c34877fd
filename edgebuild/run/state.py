"""Where an artifact stands: built at its current fingerprint or not, verified at its
current verification fingerprint or not, and what ``doit status`` says about it.

The one place these questions are answered: the doit tasks, the Python API, the
lock file, publishing, the report page and the cluster driver all ask here.

Outputs are checked through the stat cache: an output whose (device, inode, size,
mtime, ctime) is unchanged since it was last hashed is not read again, while one
edited in place -- even at the same size, with its mtime put back -- has a new
ctime and is hashed, so it never counts as built, nor as verified.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from edgebuild.core.project import Artifact, SourceNotBuilt
from edgebuild.core.record import BuildRecord, read_record_or_none
from edgebuild.core.report import read_report
from edgebuild.core.staleness import explain
from edgebuild.errors import EdgebuildError

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

State = Literal["up to date", "stale", "missing", "error"]


class VerificationState(str, enum.Enum):
    """Where an artifact stands against its current thresholds."""

    NOT_BUILT = "not built"
    NOT_VERIFIED = "not verified"
    FAILED = "verification failed"
    VERIFIED = "verified"


def changed_outputs(workspace: "Workspace", artifact: Artifact, record: BuildRecord) -> list[str]:
    """The outputs ``record`` lists that are missing from ``build/<name>/`` or no longer
    hold their recorded bytes (through the stat cache)."""
    return record.changed_outputs(artifact.directory, digest=workspace.stat_cache.file_digest)


def current_record(workspace: "Workspace", artifact: "Artifact | str") -> BuildRecord | None:
    """The record in ``build/<name>/`` when it is the build of the current fingerprint and
    every output still holds its recorded bytes; ``None`` otherwise."""
    artifact = workspace.artifact(artifact)
    record = read_record_or_none(artifact.directory)
    if record is None or record.fingerprint != artifact.fingerprint:
        return None
    return None if changed_outputs(workspace, artifact, record) else record


def is_built(workspace: "Workspace", artifact: "Artifact | str") -> bool:
    artifact = workspace.artifact(artifact)
    return current_record(workspace, artifact) is not None


def verification_state(workspace: "Workspace", artifact: "Artifact | str") -> VerificationState:
    """The one answer to "is it verified?": built at its current fingerprint with every
    output intact, and a report for its current verification fingerprint that passed."""
    artifact = workspace.artifact(artifact)
    if current_record(workspace, artifact) is None:
        return VerificationState.NOT_BUILT
    report = read_report(artifact.directory)
    if report is None or report.get("verify_fingerprint") != artifact.verify_fingerprint:
        return VerificationState.NOT_VERIFIED
    return VerificationState.VERIFIED if report.get("passed") else VerificationState.FAILED


@dataclass(frozen=True)
class ArtifactState:
    """What ``doit status`` says about one artifact."""

    artifact: str
    state: State
    fingerprint: str | None = None
    # Why it is stale, or what is wrong (state "error").
    reasons: tuple[str, ...] = ()
    # "verified", "not verified", "verification FAILED", "restorable from the store".
    note: str | None = None
    # What the note says, as a value (not compared: the note is the same fact).
    verification: VerificationState = field(default=VerificationState.NOT_BUILT, compare=False)

    @property
    def verified(self) -> bool:
        return self.verification is VerificationState.VERIFIED

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"artifact": self.artifact, "state": self.state}
        if self.fingerprint is not None:
            data["fingerprint"] = self.fingerprint
        if self.reasons:
            data["reasons"] = list(self.reasons)
        if self.note:
            data["note"] = self.note
        data["verified"] = self.verified
        return data


def status(workspace: "Workspace", artifact: "Artifact | str") -> ArtifactState:
    """Up to date (verified or not), stale (with reasons), missing, or error; builds
    nothing, reads fingerprints (through the stat cache) and records only."""
    artifact = workspace.artifact(artifact)
    name = artifact.name
    built = read_record_or_none(artifact.directory)
    try:
        current = artifact.record
    except SourceNotBuilt as waiting:
        reason = (f"its source {waiting.source} is not built at its current fingerprint; this artifact's "
                  "fingerprint follows from the source's bytes")
        return ArtifactState(name, "missing" if built is None else "stale", reasons=(reason,))
    except EdgebuildError as error:
        return ArtifactState(name, "error", reasons=(str(error),))
    fingerprint = current.fingerprint
    restorable = "restorable from the store" if workspace.store.has(fingerprint) else None
    if built is None:
        return ArtifactState(name, "missing", fingerprint, note=restorable)
    if built.fingerprint != fingerprint:
        return ArtifactState(name, "stale", fingerprint, tuple(explain(built.to_json(), current.to_json())), restorable)
    changed = changed_outputs(workspace, artifact, built)
    if changed:
        return ArtifactState(name, "stale", fingerprint,
                             tuple(f"{output} changed or missing since the build" for output in changed), restorable)
    verification = verification_state(workspace, artifact)
    note = "verification FAILED" if verification is VerificationState.FAILED else verification.value
    return ArtifactState(name, "up to date", fingerprint, note=note, verification=verification)
