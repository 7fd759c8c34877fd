"""What changed: each artifact now against the build a git revision's lock file names (the
committed ``artifacts.lock``, ``HEAD`` by default) or the latest one published at a
destination -- in its fingerprint (the words of "why stale", ``core/staleness.py``), in
its output files, in every verification check, in its coverage certificates (nodes taken
and partitions per target, and the modules whose nodes fall back now or no longer), and in
its time here (``latency``: median and ratio to its float source, shown, never a change
by itself: timings move from run to run).

The baseline's fingerprints come from the lock file (or the publish index); what that
build was -- its record, its report -- is read by fingerprint from the local store,
then the remote cache, then the destination. What no cache holds any more is said, and
only the lock entry is compared. The current side is the build in ``build/`` (or the
store) at the current fingerprint; nothing is built, verified or pulled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from edgebuild.core.figures import format_bytes
from edgebuild.core.files import LOCK_BYTES
from edgebuild.core.hashing import is_digest
from edgebuild.core.lock_format import parse_lock
from edgebuild.core.project import Artifact, SourceNotBuilt
from edgebuild.core.record import read_record_or_none
from edgebuild.cache.store import FAILED_REPORTS_KEPT
from edgebuild.core.report import read_report, report_passed
from edgebuild.core.staleness import explain, mapping_changes, verification_changes
from edgebuild.errors import DiffError, EdgebuildError, RemoteError
from edgebuild.run.vcs import committed_bytes, resolve_commit, work_tree_top

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

Change = Literal["unchanged", "changed", "added", "removed", "unknown", "error"]
# Where the build a side describes was read from.
FROM_BUILD, FROM_STORE, FROM_REMOTE, FROM_DESTINATION, FROM_LOCK = (
    "build/", "the local store", "the remote cache", "the destination", "the lock entry only")
# How many modules a coverage change names before it counts the rest.
NAMED_MODULES = 4


@dataclass(frozen=True)
class CheckChange:
    """One verification check of the two builds: its values, the change, the verdicts."""

    name: str
    before: Any
    after: Any
    # after - before, when both are finite numbers.
    delta: float | None
    comparison: str | None
    limit: Any
    passed_before: bool | None
    passed_after: bool | None

    @property
    def flipped(self) -> bool:
        """Passed in one build and failed in the other."""
        return None not in (self.passed_before, self.passed_after) and self.passed_before != self.passed_after

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "before": self.before, "after": self.after, "delta": self.delta,
                "comparison": self.comparison, "limit": self.limit, "passed_before": self.passed_before,
                "passed_after": self.passed_after, "flipped": self.flipped}


@dataclass(frozen=True)
class OutputChange:
    """One output file: its size in each build (``None`` where it is not an output) and
    whether its bytes differ."""

    file: str
    size_before: int | None
    size_after: int | None
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "size_before": self.size_before, "size_after": self.size_after,
                "changed": self.changed}


@dataclass(frozen=True)
class LatencyChange:
    """The artifact's time here in each build's report (``latency``): the median in
    milliseconds and the ratio to its float source (``None`` where not measured)."""

    median_before: float | None
    median_after: float | None
    ratio_before: float | None
    ratio_after: float | None

    def to_json(self) -> dict[str, Any]:
        return {"median_ms_before": self.median_before, "median_ms_after": self.median_after,
                "ratio_before": self.ratio_before, "ratio_after": self.ratio_after}

    def describe(self) -> str:
        """``latency: 3.1 → 3.4 ms median, 1.8x → 1.9x its float source``."""
        text = f"latency: {_ms(self.median_before)} → {_ms(self.median_after)} ms median"
        if self.ratio_before is not None or self.ratio_after is not None:
            text += f", {_times(self.ratio_before)} → {_times(self.ratio_after)} its float source"
        return text


@dataclass(frozen=True)
class CoverageChange:
    """One target's certificate (``coverage``) in each build's report: nodes taken of the
    total and partitions (``None`` where that build has no certificate of the target),
    and the modules whose nodes fell back in one build and not the other, with how many."""

    target: str
    before: tuple[int, int, int] | None
    after: tuple[int, int, int] | None
    # module -> nodes of it that fall back now and did not before (and the reverse).
    fallen: tuple[tuple[str, int], ...] = ()
    recovered: tuple[tuple[str, int], ...] = ()

    @property
    def changed(self) -> bool:
        return self.before != self.after or bool(self.fallen or self.recovered)

    def to_json(self) -> dict[str, Any]:
        def counts(side: tuple[int, int, int] | None) -> dict[str, int] | None:
            return None if side is None else dict(zip(("nodes_taken", "nodes_total", "partitions"), side))

        return {"target": self.target, "before": counts(self.before), "after": counts(self.after),
                "fallen": dict(self.fallen), "recovered": dict(self.recovered)}

    def describe(self) -> str:
        """``coverage TARGET: 396/396 → 380/396 nodes, 1 → 3 partition(s); 16 nodes of
        blocks.3.attn now fall back``."""
        def nodes(side: tuple[int, int, int] | None) -> str:
            return "–" if side is None else f"{side[0]}/{side[1]}"

        def parts(side: tuple[int, int, int] | None) -> str:
            return "–" if side is None else str(side[2])

        text = f"coverage {self.target}: {nodes(self.before)} → {nodes(self.after)} nodes"
        if self.before is None or self.after is None or self.before[2] != self.after[2]:
            text += f", {parts(self.before)} → {parts(self.after)} partition(s)"
        if self.fallen:
            text += "; now fall back: " + _by_module(self.fallen)
        if self.recovered:
            text += "; no longer fall back: " + _by_module(self.recovered)
        return text


def _by_module(counted: tuple[tuple[str, int], ...]) -> str:
    shown = [f"{count} node(s) of {module}" for module, count in counted[:NAMED_MODULES]]
    more = len(counted) - NAMED_MODULES
    return ", ".join(shown) + (f" and {more} more module(s)" if more > 0 else "")


@dataclass(frozen=True)
class ArtifactDiff:
    """One artifact against the baseline."""

    artifact: str
    kind: str | None
    change: Change
    fingerprint_before: str | None
    fingerprint_after: str | None
    # What changed in the fingerprint, in words (empty when it did not).
    reasons: tuple[str, ...] = ()
    # Threshold changes (verification settings), in the same words.
    verify_reasons: tuple[str, ...] = ()
    outputs: tuple[OutputChange, ...] = ()
    checks: tuple[CheckChange, ...] = ()
    # Where each side's build was read from (``FROM_*``), or None when there is none.
    before_from: str | None = None
    after_from: str | None = None
    # "verified", "verification failed", "not verified", "not built" (the current side).
    state_after: str | None = None
    notes: tuple[str, ...] = ()
    # The time here in each build's report, when either measured it.
    latency: LatencyChange | None = None
    # Each target's certificate whose counts or fallbacks differ between the two reports.
    coverage: tuple[CoverageChange, ...] = ()
    # The baseline's verdict as its lock entry records it: True verified, False failed,
    # None not verified (or not known: a baseline read from a published index).
    verified_before: bool | None = None
    # The baseline's checks are those of its failed verification (the store keeps the
    # report of the latest failed verification of a build apart from its entry).
    before_failed: bool = False

    @property
    def flipped(self) -> tuple[CheckChange, ...]:
        return tuple(check for check in self.checks if check.flipped)

    @property
    def verdict_flipped(self) -> bool:
        """Verified in one build and failed in the other (whatever the checks kept say)."""
        after = {"verified": True, "verification failed": False}.get(self.state_after or "")
        return None not in (self.verified_before, after) and self.verified_before != after

    def check(self, name: str) -> CheckChange | None:
        return next((check for check in self.checks if check.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact, "kind": self.kind, "change": self.change,
            "fingerprint_before": self.fingerprint_before, "fingerprint_after": self.fingerprint_after,
            "reasons": list(self.reasons), "verify_reasons": list(self.verify_reasons),
            "outputs": [output.to_json() for output in self.outputs],
            "checks": [check.to_json() for check in self.checks],
            "before_from": self.before_from, "after_from": self.after_from,
            "state_after": self.state_after, "notes": list(self.notes),
            "latency": self.latency.to_json() if self.latency is not None else None,
            "coverage": [change.to_json() for change in self.coverage],
            "verified_before": self.verified_before, "verdict_flipped": self.verdict_flipped,
            "before_failed": self.before_failed,
        }


@dataclass(frozen=True)
class Diff:
    """Every artifact asked for (and those the baseline has that the manifest no longer has)."""

    against: str
    # The commit the revision resolved to; None against a destination.
    commit: str | None
    artifacts: tuple[ArtifactDiff, ...]
    notes: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> ArtifactDiff:
        for artifact in self.artifacts:
            if artifact.artifact == name:
                return artifact
        raise KeyError(name)

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for artifact in self.artifacts:
            counts[artifact.change] = counts.get(artifact.change, 0) + 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {"against": self.against, "commit": self.commit, "notes": list(self.notes),
                "artifacts": [artifact.to_json() for artifact in self.artifacts]}


@dataclass
class _Baseline:
    """The other side: a fingerprint (and what the lock or index says) per artifact."""

    label: str
    commit: str | None
    entries: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    # A published destination, to read old builds from (``--against DEST``).
    location: Any = None


def is_destination(against: str) -> bool:
    """Whether ``--against`` names a published destination rather than a git revision."""
    return "://" in against or against.startswith(("/", "./", "../", "~"))


def diff(workspace: "Workspace", artifacts: "list[Artifact] | None" = None, against: str = "HEAD") -> Diff:
    """Each of ``artifacts`` (every artifact when ``None``) now against ``against``: a git
    revision whose committed lock file names the old fingerprints, or a published
    destination (a directory or fsspec URL) whose index names them. Raises
    :class:`DiffError` when ``against`` cannot be read."""
    baseline = _from_destination(workspace, against) if is_destination(against) else _from_revision(workspace, against)
    chosen = workspace.order(artifacts) if artifacts else workspace.order()
    results = [_artifact_diff(workspace, artifact, baseline) for artifact in chosen]
    if not artifacts:
        for name in sorted(set(baseline.entries) - set(workspace.manifest.artifacts)):
            entry = baseline.entries[name]
            results.append(ArtifactDiff(name, entry.get("kind"), "removed", entry.get("fingerprint"), None,
                                        notes=(f"in {baseline.label}, not in {workspace.manifest.path.name} now",)))
    return Diff(baseline.label, baseline.commit, tuple(results), tuple(baseline.notes))


# --- the baseline ---------------------------------------------------------------------

def _from_revision(workspace: "Workspace", revision: str) -> _Baseline:
    root = workspace.manifest.root
    lock_name = workspace.lock_path.name
    top = work_tree_top(root)
    if top is None:
        raise DiffError(f"--against {revision}: {workspace.manifest.path.name} is not in a git work tree, so it has "
                        "no committed lock file to compare with; compare with a published destination (--against DEST)")
    commit = resolve_commit(root, revision)
    if commit is None:
        raise DiffError(f"--against {revision}: not a commit of the git repository at {top}")
    # A hash names itself; a name (HEAD, main, v1.2) is shown with the commit it is now.
    label = commit[:12] if commit.startswith(revision.lower()) else f"{revision} ({commit[:12]})"
    raw = committed_bytes(workspace.lock_path, LOCK_BYTES, commit)
    if raw is None:
        return _Baseline(label, commit, {}, [f"{lock_name} is not committed at {label}: every artifact is new there"])
    entries = parse_lock(raw, f"{lock_name} at {label}")
    for name, entry in entries.items():
        problem = _entry_problem(entry)
        if problem:
            raise DiffError(f"{lock_name} at {label}: artifacts.{name}: {problem}; expected an entry `doit build` writes")
    return _Baseline(label, commit, entries)


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    if not is_digest(entry.get("fingerprint")):
        return "fingerprint is not a digest"
    for key in ("params", "inputs", "code", "versions", "outputs"):
        if not isinstance(entry.get(key, {}), dict):
            return f"{key} is not an object"
    return None


def _from_destination(workspace: "Workspace", destination: str) -> _Baseline:
    from edgebuild.cache.location import Location, shown_setting
    from edgebuild.run.publish import INDEX_KEY, latest_published, read_index

    shown = shown_setting("--against", destination)
    try:
        location = Location(destination, workspace.manifest.root, setting="--against")
        location.check_root()  # a destination that is not there is no baseline, not an empty one
        index = read_index(location)
    except EdgebuildError as error:
        # Reaching the location, its errors name --against already; an index's name only the file.
        message = str(error)
        raise DiffError(message if message.startswith(shown) else f"{shown}: {message}") from None
    entries = {name: {"fingerprint": fingerprint, "kind": row.get("kind")}
               for name, (fingerprint, row) in latest_published(index).items()}
    notes = [] if entries else [f"{location.where(INDEX_KEY)} lists no published artifact"]
    return _Baseline(destination, None, entries, notes, location)


# --- one artifact ---------------------------------------------------------------------

def _artifact_diff(workspace: "Workspace", artifact: Artifact, baseline: _Baseline) -> ArtifactDiff:
    name = artifact.name
    kind = artifact.params.kind
    entry = baseline.entries.get(name)
    before_fp = entry.get("fingerprint") if entry else None
    notes: list[str] = []
    try:
        current = artifact.record
    except SourceNotBuilt as waiting:
        notes.append(f"its source {waiting.source} is not built at its current fingerprint, so its own cannot be "
                     f"known (it follows from the source's bytes): `doit build {name}` builds both")
        return ArtifactDiff(name, kind, "unknown" if entry else "added", before_fp, None, notes=tuple(notes))
    except EdgebuildError as error:
        return ArtifactDiff(name, kind, "error", before_fp, None, notes=(str(error),))
    after_fp = current.fingerprint
    verify_fp = _verify_fingerprint(artifact)
    after_record, after_report, after_from, state = _current_build(workspace, artifact, verify_fp)
    if after_report is not None and after_report.get("verify_fingerprint") != verify_fp:
        notes.append("the checks now are this build's last verification, under other thresholds or judging "
                     f"code than the manifest's now (`doit verify {name}` judges it again)")
    if after_record is None:
        notes.append(f"not built at its current fingerprint {after_fp[:12]}: only fingerprints are compared "
                     f"(`doit verify {name}` builds it)")
    if entry is None:
        return ArtifactDiff(name, kind, "added", None, after_fp, checks=_checks(None, after_report),
                            outputs=_outputs({}, (after_record or {}).get("outputs", {})), after_from=after_from,
                            state_after=state, notes=(f"not in {baseline.label}", *notes))
    before_record, before_report, before_from = _baseline_build(workspace, name, entry, baseline, notes)
    judged = entry.get("verify_fingerprint")
    later_judgement = before_report is not None and is_digest(judged) and before_report.get("verify_fingerprint") != judged
    if later_judgement:
        # The store keeps a build's latest passing report: a later judgement of the same
        # bytes (thresholds moved since) is not the verdict the baseline recorded.
        before_report = None
    before_failed = False
    if before_report is None and entry.get("verified") is False:
        # No entry keeps a failed verification's report; the store keeps the latest ones
        # apart (cache/store.py): the old checks of the loop of fixing a failing build.
        failed = workspace.store.failed_report(before_fp) if isinstance(before_fp, str) else None
        if failed is not None and (not is_digest(judged) or failed.get("verify_fingerprint") == judged):
            before_report, before_failed = failed, True
    if before_report is None and before_from != FROM_LOCK:
        notes.append(_no_old_checks(baseline.label, entry, before_from, later_judgement))
    change: Change = "unchanged" if before_fp == after_fp else "changed"
    reasons = tuple(explain(before_record, current.to_json())) if change == "changed" else ()
    verify_reasons = _verify_changes(workspace, artifact, entry, before_report, verify_fp, change)
    return ArtifactDiff(
        name, kind, change, before_fp, after_fp, reasons, verify_reasons,
        _outputs(before_record.get("outputs", {}), (after_record or {}).get("outputs", {})) if after_record else (),
        _checks(before_report, after_report), before_from, after_from, state, tuple(notes),
        _latency(before_report, after_report), _coverage(before_report, after_report),
        entry.get("verified") if isinstance(entry.get("verified"), bool) else None, before_failed,
    )


def _no_old_checks(label: str, entry: dict[str, Any], before_from: str, later_judgement: bool) -> str:
    """The one note that says why the baseline's check values are not shown, when its build
    was found (a build only its lock entry describes is noted where it is looked for)."""
    if entry.get("verified") is False:
        return (f"it FAILED verification at {label}, and the report of that verification is not kept here (the store "
                f"keeps those of the latest {FAILED_REPORTS_KEPT} failed verifications run on this machine): its "
                "checks then are not shown (its thresholds are, from the lock entry)")
    if later_judgement:
        return (f"the report {before_from} keeps of its build is of a later verification (other thresholds or judging "
                f"code) than the one at {label}: its checks then are not shown")
    if entry.get("verified") is None and "verified" in entry:
        return f"it was not verified at {label}: there are no checks then to show"
    return f"{before_from} keeps its build but not the report of its verification at {label}: its checks then are not shown"


def _verify_parts(workspace: "Workspace", artifact: Artifact) -> dict[str, str]:
    """The digest of each part of the artifact's verification fingerprint now (none when
    one cannot be computed: a verification-only file that cannot be read)."""
    try:
        return workspace.verify_parts(artifact)
    except EdgebuildError:
        return {}


def _verify_fingerprint(artifact: Artifact) -> str | None:
    """The current verification fingerprint; ``None`` when a file only verification reads
    cannot be read (then no verification counts as current)."""
    try:
        return artifact.verify_fingerprint
    except EdgebuildError:
        return None


def _verify_changes(workspace: "Workspace", artifact: Artifact, entry: dict[str, Any], before_report: dict[str, Any] | None,
                    verify_fp: str | None, change: Change) -> tuple[str, ...]:
    """What changed in how the artifact is judged: thresholds (the baseline's report's
    against the manifest's now), the judging code (from the lock entry), and -- when the
    build is the same but its verification fingerprint is not, with neither of those --
    the files only verification reads."""
    # The thresholds it was judged with: its lock entry's (what that commit declared), else
    # its report's (a published baseline's index holds none).
    thresholds = entry.get("verify")
    if not isinstance(thresholds, dict):
        thresholds = before_report.get("verify") if before_report is not None else None
    parts = entry.get("verify_parts")
    reasons = verification_changes(thresholds, parts if verify_fp is not None else None,
                                   artifact.params.verify_parameters(), _verify_parts(workspace, artifact), skip=("code",))
    if isinstance(entry.get("verify_code"), dict):
        reasons += mapping_changes(entry["verify_code"], workspace.verify_code(artifact),
                                   "judging code {} changed", "judging code {} added", "judging code {} removed")
    if not isinstance(parts, dict) and change == "unchanged" and not reasons \
            and entry.get("verify_fingerprint") not in (None, verify_fp):
        # A lock entry written before it named its parts.
        reasons.append("the files only verification reads changed (held-out inputs)")
    return tuple(reasons)


def _current_build(workspace: "Workspace", artifact: Artifact,
                   verify_fp: str | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None, str | None, str]:
    """The build of the current fingerprint -- its record and report, where it is, and
    its verification state -- from ``build/`` (outputs intact) or the store."""
    from edgebuild.run.state import VerificationState, current_record, verification_state

    fingerprint = artifact.fingerprint
    record = current_record(workspace, artifact)
    if record is not None:
        report = _report_of(read_report(artifact.directory), fingerprint)
        if verify_fp is None:
            return record.to_json(), report, FROM_BUILD, VerificationState.NOT_VERIFIED.value
        return record.to_json(), report, FROM_BUILD, verification_state(workspace, artifact).value
    stored = workspace.store.record(fingerprint)
    if stored is not None:
        report = _report_of(workspace.store.report(fingerprint), fingerprint)
        verified = report is not None and verify_fp is not None and report.get("verify_fingerprint") == verify_fp
        state = (VerificationState.VERIFIED if report_passed(report) else VerificationState.FAILED) if verified \
            else VerificationState.NOT_VERIFIED
        return stored.to_json(), report, FROM_STORE, f"{state.value} (in the store, not in build/)"
    return None, None, None, VerificationState.NOT_BUILT.value


def _baseline_build(workspace: "Workspace", name: str, entry: dict[str, Any], baseline: _Baseline,
                    notes: list[str]) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """The baseline's build of ``name``: its record's fields and its report, from the first
    place that holds it; else the lock entry itself (a record's fields, no report)."""
    fingerprint = entry["fingerprint"]
    stored = workspace.store.record(fingerprint)
    if stored is not None:
        return stored.to_json(), _report_of(workspace.store.report(fingerprint), fingerprint), FROM_STORE
    built = read_record_or_none(workspace.layout.artifact_dir(name))
    if built is not None and built.fingerprint == fingerprint:
        return built.to_json(), _report_of(read_report(workspace.layout.artifact_dir(name)), fingerprint), FROM_BUILD
    try:
        remote = workspace.remote
        if remote is not None:
            record, report = remote.described(fingerprint)
            if record is not None:
                return record.to_json(), report, FROM_REMOTE
    except RemoteError as error:
        notes.append(f"the remote cache could not be read ({error})")
    if baseline.location is not None:
        from edgebuild.run.publish import published_build

        try:
            record, report = published_build(baseline.location, name, fingerprint)
        except RemoteError as error:
            record, report = None, None
            notes.append(f"the published build could not be read ({error})")
        if record is not None:
            return record, report, FROM_DESTINATION
    notes.append(f"the build at {baseline.label} ({fingerprint[:12]}) is not in any cache: only its lock entry "
                 "is compared")
    return entry, None, FROM_LOCK


def _report_of(report: dict[str, Any] | None, fingerprint: str) -> dict[str, Any] | None:
    """``report`` when it is the report of the build of ``fingerprint``; never another's."""
    return report if report is not None and report.get("fingerprint") == fingerprint else None


# --- outputs and checks ---------------------------------------------------------------

def _outputs(before: dict[str, Any], after: dict[str, Any]) -> tuple[OutputChange, ...]:
    changes = []
    for file in sorted(set(before) | set(after)):
        old, new = before.get(file) or {}, after.get(file) or {}
        changes.append(OutputChange(file, old.get("size"), new.get("size"),
                                    old.get("digest") != new.get("digest") or old.get("size") != new.get("size")))
    return tuple(changes)


def _checks(before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[CheckChange, ...]:
    old = {check.get("name"): check for check in (before or {}).get("checks", []) if isinstance(check, dict)}
    new = {check.get("name"): check for check in (after or {}).get("checks", []) if isinstance(check, dict)}
    names = list(new) + [name for name in old if name not in new]
    changes = []
    for name in names:
        first, second = old.get(name), new.get(name)
        value_before = first.get("value") if first else None
        value_after = second.get("value") if second else None
        latest = second or first
        changes.append(CheckChange(
            str(name), value_before, value_after, _delta(value_before, value_after),
            latest.get("comparison"), latest.get("limit"),
            bool(first.get("passed")) if first else None, bool(second.get("passed")) if second else None,
        ))
    return tuple(changes)


def _latency(before: dict[str, Any] | None, after: dict[str, Any] | None) -> LatencyChange | None:
    """Each report's ``latency`` (median, ratio); ``None`` when neither measured it."""
    def numbers(report: dict[str, Any] | None) -> tuple[float | None, float | None]:
        latency = (report or {}).get("latency")
        if not isinstance(latency, dict) or not latency.get("measured"):
            return None, None
        return _finite(latency.get("median_ms")), _finite(latency.get("ratio"))

    (median_before, ratio_before), (median_after, ratio_after) = numbers(before), numbers(after)
    if median_before is None and median_after is None:
        return None
    return LatencyChange(median_before, median_after, ratio_before, ratio_after)


def _coverage(before: dict[str, Any] | None, after: dict[str, Any] | None) -> tuple[CoverageChange, ...]:
    """Each target whose certificate differs between the two reports (``coverage``): its
    counts, and the modules of the nodes that fall back in one and not the other. A
    target only one report certified is a change only when both reports were judged."""
    def certificates(report: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
        found = (report or {}).get("coverage")
        return {target: value for target, value in found.items() if isinstance(value, dict)} \
            if isinstance(found, dict) else {}

    def counts(certificate: dict[str, Any] | None) -> tuple[int, int, int] | None:
        if certificate is None:
            return None
        numbers = [certificate.get(key) for key in ("nodes_taken", "nodes_total", "partitions")]
        return tuple(numbers) if all(isinstance(n, int) and not isinstance(n, bool) for n in numbers) else None  # type: ignore[return-value]

    def fallbacks(certificate: dict[str, Any] | None) -> dict[tuple[str, str], str]:
        entries = (certificate or {}).get("fallbacks")
        return {(str(entry.get("node")), str(entry.get("op_type"))): str(entry.get("module") or "a node of no module")
                for entry in entries if isinstance(entry, dict)} if isinstance(entries, list) else {}

    def by_module(nodes: dict[tuple[str, str], str], keys: set[tuple[str, str]]) -> tuple[tuple[str, int], ...]:
        counted: dict[str, int] = {}
        for key in keys:
            counted[nodes[key]] = counted.get(nodes[key], 0) + 1
        return tuple(sorted(counted.items(), key=lambda item: (-item[1], item[0])))

    if any(report is None or ("coverage" not in report and "coverage_not_computed" not in report)
           for report in (before, after)):
        return ()  # a side with no report, or one written before certificates were
    old, new = certificates(before), certificates(after)
    changes = []
    for target in list(new) + [target for target in old if target not in new]:
        was, now = fallbacks(old.get(target)), fallbacks(new.get(target))
        change = CoverageChange(target, counts(old.get(target)), counts(new.get(target)),
                                by_module(now, set(now) - set(was)), by_module(was, set(was) - set(now)))
        if change.changed:
            changes.append(change)
    return tuple(changes)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


def _delta(before: Any, after: Any) -> float | None:
    numbers = [value for value in (before, after)
               if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)]
    return float(after - before) if len(numbers) == 2 else None


# --- text -----------------------------------------------------------------------------

def render(result: Diff, verbose: bool = False) -> list[str]:
    """``doit diff``'s lines: a headline, then each artifact that changed with its reasons,
    outputs and checks; unchanged ones take one line each."""
    counts = result.counts()
    summary = ", ".join(f"{count} {change}" for change, count in sorted(counts.items())) or "no artifacts"
    lines = [f"diff against {result.against}: {summary}"]
    lines += [f"  note: {note}" for note in result.notes]
    width = max((len(artifact.artifact) for artifact in result.artifacts), default=0)
    for artifact in result.artifacts:
        head = f"{artifact.artifact:<{width}}  {artifact.change}"
        if artifact.change == "changed" and artifact.fingerprint_before:
            head += f"  {artifact.fingerprint_before[:12]} → {(artifact.fingerprint_after or '?')[:12]}"
        if artifact.state_after and artifact.change != "removed":
            head += f"  (now {artifact.state_after})"
        if artifact.verdict_flipped:
            head += f"  verdict {'verified' if artifact.verified_before else 'FAILED'} → " \
                    f"{'verified' if artifact.state_after == 'verified' else 'FAILED'}"
        elif artifact.verified_before is False and artifact.change != "removed":
            # The loop of fixing a failing build: FAILED then, and what it is now.
            now = "FAILED" if (artifact.state_after or "").startswith("verification failed") else artifact.state_after
            head += f"  verdict FAILED → {now}"
        lines.append(head)
        quiet = artifact.change == "unchanged" and not artifact.flipped and not artifact.verify_reasons \
            and not artifact.coverage and not artifact.verdict_flipped and not verbose
        if quiet:
            continue
        if artifact.change == "added" and not verbose:
            # Nothing to compare with: what it holds, counted, and why it is new.
            lines.append(f"    {len(artifact.outputs)} output(s), {len(artifact.checks)} check(s) (--all shows them)")
            lines += [f"    note: {note}" for note in artifact.notes]
            continue
        lines += [f"    - {reason}" for reason in (*artifact.reasons, *artifact.verify_reasons)]
        for output in artifact.outputs:
            if output.changed:
                lines.append(f"    output {output.file}: {format_bytes(output.size_before)} → {format_bytes(output.size_after)}")
        same = 0
        for check in artifact.checks:
            if not verbose and check.before == check.after and not check.flipped:
                same += 1
                continue
            line = f"    check {check.name}: {_shown(check.before)} → {_shown(check.after)}"
            if check.delta is not None and check.delta != 0:
                line += f" ({check.delta:+.3g})"
            if check.flipped:
                line += f"  {'pass' if check.passed_before else 'FAIL'} → {'pass' if check.passed_after else 'FAIL'}"
            lines.append(line)
        if same:
            lines.append(f"    {same} other check(s) unchanged (--all shows them)")
        if artifact.latency is not None:
            lines.append(f"    {artifact.latency.describe()}")
        lines += [f"    {change.describe()}" for change in artifact.coverage]
        lines += [f"    note: {note}" for note in artifact.notes]
    return lines


def _ms(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2g}x"


def _shown(value: Any) -> str:
    from edgebuild.core.report import format_number

    return "–" if value is None else format_number(value)
