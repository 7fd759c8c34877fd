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
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Literal

from edgebuild.core.project import Artifact, SourceNotBuilt
from edgebuild.core.record import BuildRecord, read_record_or_none
from edgebuild.core.report import read_report, verdict_problem
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
    # Its own report passed, but an artifact it is made from is not verified: it does not count.
    SOURCE_NOT_VERIFIED = "source not verified"
    VERIFIED = "verified"


def changed_outputs(workspace: "Workspace", artifact: Artifact, record: BuildRecord) -> list[str]:
    """The outputs ``record`` lists that are missing from ``build/<name>/`` or no longer
    hold their recorded bytes (through the stat cache)."""
    return record.changed_outputs(artifact.directory, digest=workspace.stat_cache.file_digest)


def current_record(workspace: "Workspace", artifact: "Artifact") -> BuildRecord | None:
    """The record in ``build/<name>/`` when it is the build of the current fingerprint and
    every output still holds its recorded bytes; ``None`` otherwise."""
    record = read_record_or_none(artifact.directory)
    if record is None or record.fingerprint != artifact.fingerprint:
        return None
    return None if changed_outputs(workspace, artifact, record) else record


def is_built(workspace: "Workspace", artifact: "Artifact") -> bool:
    return current_record(workspace, artifact) is not None


def verification_state(workspace: "Workspace", artifact: "Artifact") -> VerificationState:
    """The one answer to "is it verified?": built at its current fingerprint with every
    output intact, a report for its current verification fingerprint that passed, and
    every artifact it is made from verified too (the chain rule: a QNN context compiled
    from a QDQ graph that failed is not verified, whatever its own checks say)."""
    own = _own_verification_state(workspace, artifact)
    if own is VerificationState.VERIFIED and unverified_source(workspace, artifact) is not None:
        return VerificationState.SOURCE_NOT_VERIFIED
    return own


def _judged(workspace: "Workspace", artifact: Artifact) -> tuple[BuildRecord | None, dict[str, Any] | None]:
    """The current build's record (``None``: not built) and its report at the current
    verification fingerprint (``None``: not judged at it)."""
    record = current_record(workspace, artifact)
    report = read_report(artifact.directory) if record is not None else None
    if report is None or report.get("verify_fingerprint") != artifact.verify_fingerprint:
        return record, None
    return record, report


def _own_verification_state(workspace: "Workspace", artifact: Artifact) -> VerificationState:
    record, report = _judged(workspace, artifact)
    if record is None:
        return VerificationState.NOT_BUILT
    if report is None:
        return VerificationState.NOT_VERIFIED
    if report_distrust(workspace, artifact, record, report) is not None:
        # Not the verdict verification wrote: judged again, never trusted.
        return VerificationState.NOT_VERIFIED
    return VerificationState.VERIFIED if report["passed"] is True else VerificationState.FAILED


def report_distrust(workspace: "Workspace", artifact: Artifact, record: BuildRecord,
                    report: dict[str, Any]) -> str | None:
    """Why ``build/<name>/report.json`` is not a verdict to go by (one line): its files
    are not the ones verification sealed in the record, or its verdict does not follow
    from its checks' values and limits. ``None`` when it is."""
    problem = record.unsealed_report(artifact.directory, digest=workspace.stat_cache.file_digest) \
        or verdict_problem(report) or _withdrawn_signature(workspace, record)
    return f"build/{artifact.name}/report.json is not taken as written: {problem}" if problem else None


def _withdrawn_signature(workspace: "Workspace", record: BuildRecord) -> str | None:
    """Why a report pulled under a key's signature no longer counts: that key is no
    longer trusted here (``None``: judged here, or its key still trusted)."""
    from edgebuild.cache.signing import KEY_ID_SHOWN

    vouched = workspace.store.vouched_by(record.fingerprint)
    if vouched is None or vouched["key"] in workspace.trusted_key_ids:
        return None
    key = vouched["key"]
    shown = key[:KEY_ID_SHOWN] if key.isascii() and key.isalnum() else "(unreadable)"
    return (f"it was pulled from {vouched['from']} under the signature of key {shown}, which is no longer "
            "a trusted key here (EDGEBUILD_TRUSTED_KEYS)")


def refused_report(workspace: "Workspace", artifact: Artifact) -> str | None:
    """:func:`report_distrust` of the current build's report at the current verification
    fingerprint; ``None`` where there is no such report, or it is taken as written."""
    record, report = _judged(workspace, artifact)
    return report_distrust(workspace, artifact, record, report) if record is not None and report is not None else None


def unverified_source(workspace: "Workspace", artifact: "Artifact") -> "tuple[Artifact, VerificationState] | None":
    """The artifact ``artifact`` is made from (a source, a source's source, ...) that holds
    its verification back, and where it stands; ``None`` when every one is verified. The
    one that FAILED, however far up (what the nearer ones wait for), else the nearest
    that is not verified."""
    for source in artifact.sources:
        try:
            own = _own_verification_state(workspace, source)
        except EdgebuildError:
            own = VerificationState.NOT_BUILT
        deeper = unverified_source(workspace, source)
        if deeper is not None and (own is VerificationState.VERIFIED or deeper[1] is VerificationState.FAILED):
            return deeper
        if own is not VerificationState.VERIFIED:
            return source, own
    return None


def source_blocking(workspace: "Workspace", artifact: "Artifact") -> "tuple[Artifact, str] | None":
    """The artifact up ``artifact``'s chain that holds its verification back (it does not
    count, and is not run), and why, in words; ``None`` when nothing does."""
    found = unverified_source(workspace, artifact)
    if found is None:
        return None
    source, state = found
    said = {
        VerificationState.FAILED: "FAILED verification (see build/{name}/report.md)",
        VerificationState.NOT_VERIFIED: "is not verified at its current verification fingerprint",
        VerificationState.NOT_BUILT: "is not built at its current fingerprint",
    }[state].format(name=source.name)
    direct = source.name in {item.name for item in artifact.sources}
    return source, f"its source {source.name} {said}" if direct else f"{source.name} (up its chain) {said}"


@dataclass(frozen=True)
class ArtifactState:
    """What ``doit status`` says about one artifact."""

    artifact: str
    state: State
    fingerprint: str | None = None
    # Why it is stale, or what is wrong (state "error").
    reasons: tuple[str, ...] = ()
    # "verified", "not verified", "verification FAILED", "restorable from the store", "REFUSED ...".
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


def statuses(workspace: "Workspace", artifacts: "Iterable[Artifact]") -> list[ArtifactState]:
    """:func:`status` of each of ``artifacts``, as of one listing of ``build/`` and of each
    entry directory of the store: an artifact neither lists is missing and not stored
    without a look-up of its own (three failed opens an artifact, a fifth of a
    10,000-artifact `doit status`)."""
    try:
        # Case folded: on a filesystem that ignores case, build/Tower is build/tower's directory.
        built: frozenset[str] | None = frozenset(entry.casefold() for entry in os.listdir(workspace.layout.build_dir))
    except FileNotFoundError:
        built = frozenset()
    except OSError:
        # Not listable: each artifact finds out for itself, and says why.
        built = None
    with workspace.store.listed():
        return [status(workspace, artifact, built) for artifact in artifacts]


def status(workspace: "Workspace", artifact: "Artifact", built_names: frozenset[str] | None = None) -> ArtifactState:
    """Up to date (verified or not), stale (with reasons), missing, or error; builds
    nothing, reads fingerprints (through the stat cache) and records only.
    ``built_names``: what a listing of ``build/`` showed, case folded (:func:`statuses`)."""
    name = artifact.name
    built = read_record_or_none(artifact.directory) if built_names is None or name.casefold() in built_names else None
    try:
        fingerprint = artifact.fingerprint
    except SourceNotBuilt as waiting:
        reason = (f"its source {waiting.source} is not built at its current fingerprint; this artifact's "
                  "fingerprint follows from the source's bytes")
        return ArtifactState(name, "missing" if built is None else "stale", reasons=(reason,))
    except EdgebuildError as error:
        return ArtifactState(name, "error", reasons=(str(error),))
    # What the store holds of the current fingerprint: a build to restore, or why it was refused.
    stored = "restorable from the store" if workspace.store.has(fingerprint) else None
    rejected = None if stored else workspace.store.rejection(fingerprint)
    if rejected is not None:
        # What the next `doit build` will answer, without trying.
        stored = f"REFUSED at this fingerprint on {rejected.get('at', '?')}: {rejected['message']}"
    if built is None:
        return ArtifactState(name, "missing", fingerprint, note=stored)
    if built.fingerprint != fingerprint:
        return ArtifactState(name, "stale", fingerprint, tuple(explain(built.to_json(), artifact.record.to_json())), stored)
    changed = changed_outputs(workspace, artifact, built)
    if changed:
        return ArtifactState(name, "stale", fingerprint,
                             tuple(f"{output} changed or missing since the build" for output in changed), stored)
    verification = verification_state(workspace, artifact)
    note = "verification FAILED" if verification is VerificationState.FAILED else verification.value
    reasons: list[str] = []
    if verification is VerificationState.NOT_VERIFIED:
        reasons += _rejudged_because(workspace, artifact)
    if verification is not VerificationState.VERIFIED:
        blocking = source_blocking(workspace, artifact)
        if blocking is not None:
            # Its own verdict does not count (or cannot be reached) while the chain is not verified.
            reasons.append(f"not verified while {blocking[1]}")
    return ArtifactState(name, "up to date", fingerprint, reasons=tuple(reasons), note=note, verification=verification)


def _rejudged_because(workspace: "Workspace", artifact: Artifact) -> list[str]:
    """Why a build judged before must be judged again: what its report was judged with
    against what the manifest and the code say now (nothing when it was never judged)."""
    from edgebuild.core.staleness import coverage_tool_changes, verification_changes

    report = read_report(artifact.directory)
    if report is None or report.get("fingerprint") != artifact.fingerprint:
        return []
    distrust = refused_report(workspace, artifact)
    if distrust is not None:
        return [f"{distrust}; `doit verify {artifact.name}` judges it again"]
    try:
        now = workspace.verify_parts(artifact)
    except EdgebuildError as error:
        return [str(error)]
    before = report.get("verify_parts")
    tools_moved = isinstance(before, dict) and "coverage_tools" in before \
        and before["coverage_tools"] != now.get("coverage_tools")
    # Which certificate, from which version to which, where the report's certificates say.
    tools = coverage_tool_changes(report.get("coverage"), workspace.coverage_tools(artifact)) if tools_moved else []
    reasons = verification_changes(report.get("verify"), before, artifact.params.verify_parameters(), now,
                                   skip=("coverage_tools",) if tools else ()) + tools
    return reasons or ["judged before with other judging code or verification inputs (a report of an earlier edgebuild)"]
