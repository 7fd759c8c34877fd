"""The one plan/run loop: what needs building, what needs verifying, the steps that do
it, and the bookkeeping of what passed, failed or never ran.

Every way of running artifacts goes through here: the doit tasks (``uptodate`` is
:func:`needs_build` / :func:`needs_verify`, the actions are :func:`build` /
:func:`verify`, the reporter records into :class:`Outcomes`), the Python API
(:func:`run`), and the cluster driver and its jobs. One rule each, so they cannot
disagree:

- needs build: ``build/<name>/`` is not the build of the current fingerprint with
  every output intact;
- needs verify: not verified at the current verification fingerprint, or verified
  here but not yet kept -- in the store with its report, and in a writable remote
  cache (the step then keeps and pushes it, without judging it again). A read-only
  remote takes no push, so it is not waited for.
- the chain rule: an artifact's verification runs after its sources' verifications,
  and only when they passed: one whose source (or any artifact it is made from) failed
  is not run, and is never kept or pushed as verified (``state.py``).

A step decides where its work runs: a restore, a pull and keeping a verified build
cost no export's memory and run in the calling process; an export and a judgement
run in a worker process of their own (``workers.py``), which hands all of its
memory back when it exits -- or here too, for a kind that declares ``in_process``
(its steps load no model). The worker exports only: the caches were asked here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from edgebuild.core.project import Artifact, SourceNotBuilt
from edgebuild.core.atomic import remove_directory
from edgebuild.errors import EdgebuildError, SourceNotVerified, VerificationFailed, WorkerKilled
from edgebuild.run.builder import keep_verified, materialise, refuse_unverified_sources, refused_export, stderr_log
from edgebuild.run.state import VerificationState, is_built, verification_state
from edgebuild.run.workers import Relay, run_step

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

Log = Callable[[str], None]


# --- the rules ----------------------------------------------------------------------------


def needs_build(workspace: "Workspace", artifact: Artifact) -> bool:
    return not is_built(workspace, artifact)


def needs_verify(workspace: "Workspace", artifact: Artifact) -> bool:
    if verification_state(workspace, artifact) is not VerificationState.VERIFIED:
        return True
    # Verified, but its report is not kept with the stored build (a run killed between
    # the two), or not yet shared (verified before the remote cache was set, or before
    # it lost the entry): the step keeps and pushes it.
    if not workspace.store.has_report(artifact.fingerprint, artifact.verify_fingerprint):
        return True
    remote = workspace.remote
    return remote is not None and remote.takes_pushes(artifact.fingerprint)


def needs_a_worker(workspace: "Workspace", artifacts: "list[Artifact]", verifying: bool) -> bool:
    """Whether running ``artifacts`` (sources first) will start a worker, as far as this
    process can tell without asking a remote cache: one is not built and not in the
    store, or (``verifying``) not verified. Sources come first, so an artifact whose
    fingerprint cannot be taken yet has its sources in the store: whether it will need a
    worker is known only once they are restored, and it does not count. Nor does one
    whose manifest entry is broken: the run says what is wrong, and starts nothing."""
    for artifact in artifacts:
        if artifact.kind.process.in_process:
            continue
        try:
            built = not needs_build(workspace, artifact)
            if not built and not workspace.store.has(artifact.fingerprint):
                return True
            # A build restored from the store comes with its report, where one passed; one
            # whose own report passed waits on its sources, counted before it.
            judged = (VerificationState.VERIFIED, VerificationState.SOURCE_NOT_VERIFIED)
            if verifying and not (verification_state(workspace, artifact) in judged if built else
                                  workspace.store.has_report(artifact.fingerprint, artifact.verify_fingerprint)):
                return True
        except SourceNotBuilt:
            continue
        except EdgebuildError:
            return False
    return False


# --- the steps ----------------------------------------------------------------------------


def build(workspace: "Workspace", artifact: Artifact, log: Log | None = None, relay: Relay | None = None) -> str:
    """Make ``build/<name>/`` current and return its fingerprint: up to date, restored or
    pulled here; exported where its kind's steps run (a worker process, or here for an
    ``in_process`` kind), which does not ask the caches again (refused under the
    ``pull_only`` setting)."""
    log = log or stderr_log(artifact.name)
    record = materialise(workspace, artifact, log)
    if record is not None:
        return record.fingerprint
    if workspace.settings.pull_only:
        raise refused_export(workspace, artifact)
    # A worker saved its outputs' digests in the stat cache: the next check here reads
    # their rows (their stats are new to this process), never their bytes.
    return str(run_step("export", workspace, artifact, log, relay)["fingerprint"])


def verify(workspace: "Workspace", artifact: Artifact, log: Log | None = None, relay: Relay | None = None) -> str:
    """Verify ``build/<name>/`` in a worker process, unless its report already passed at
    the current verification fingerprint (then keep and push it); return that fingerprint."""
    log = log or stderr_log(artifact.name)
    refuse_unverified_sources(workspace, artifact)
    if verification_state(workspace, artifact) is VerificationState.VERIFIED:
        # Its report names this verification fingerprint (the build's, the thresholds and
        # the judging code) and passed, and every output is at its recorded digest: the
        # verdict would be the same. A shard or a cluster worker judged it; a gather step
        # pulls and keeps it, and re-runs no model.
        log("verified already: its report passed at this verification fingerprint; not judged again")
        keep_verified(workspace, artifact, log)
        return artifact.verify_fingerprint
    if workspace.frozen:
        raise VerificationFailed(
            f"{artifact.name}: the build pulled by the committed lock file's fingerprint has no passing report at this "
            f"checkout's verification fingerprint {artifact.verify_fingerprint[:12]} (thresholds, judging code or "
            "held-out files changed since), and --frozen judges nothing here: run doit verify without --frozen"
        )
    try:
        return str(run_step("verify", workspace, artifact, log, relay)["verify_fingerprint"])
    except WorkerKilled as died:
        # A worker killed after its passing report was complete (between the report and
        # the store) left a verdict that stands: kept and pushed here, what it was about to
        # do, so that this run's summary, `doit status` and the store agree. (One that failed
        # on its own fails the step: a bug is not passed over.)
        if verification_state(workspace, artifact) is not VerificationState.VERIFIED:
            raise
        log(str(died).removeprefix(f"{artifact.name}: "))
        keep_verified(workspace, artifact, log)
        return artifact.verify_fingerprint
    except VerificationFailed as failed:
        pulled = workspace.store.unvouched(artifact.fingerprint)
        if pulled is None:
            raise
        return _export_instead_of(workspace, artifact, pulled, failed, log, relay)


def _export_instead_of(workspace: "Workspace", artifact: Artifact, pulled: str, failed: VerificationFailed,
                       log: Log, relay: Relay | None) -> str:
    """A build pulled unvouched failed verification here: it is thrown away (here, and
    from a writable remote, so the next push replaces it), exported here with the remote
    cache left out, and verified again."""
    log(f"the pulled build failed verification here ({pulled}); it is thrown away and exported here instead")
    remote = workspace.remote
    if remote is not None and not remote.readonly:
        remote.drop(artifact.fingerprint)
    workspace.store.remove(artifact.fingerprint)
    if workspace.settings.pull_only:
        raise VerificationFailed(f"{failed} (the build was pulled: {pulled}; --pull-only exports nothing)") from None
    # Moved aside first, like every removal here: build/<name>/ is the pulled build or nothing.
    remove_directory(artifact.directory, workspace.layout.scratch_dir)
    # An export asks no remote cache (the read-only one would hand the same entry back).
    run_step("export", workspace, artifact, log, relay)
    return str(run_step("verify", workspace, artifact, log, relay)["verify_fingerprint"])


# --- the bookkeeping ----------------------------------------------------------------------


@dataclass
class Outcomes:
    """What happened to each artifact of a run: succeeded (built, verified, or up to date)
    or failed, and why (its own error, or ``None`` when something it depends on failed)."""

    succeeded: set[str] = field(default_factory=set)
    failed: dict[str, str | None] = field(default_factory=dict)
    # The exception behind each failure, where the run was in this process.
    exceptions: dict[str, EdgebuildError] = field(default_factory=dict)
    # Why a task was not run, where it says more than "something it depends on failed".
    not_run_because: dict[str, str] = field(default_factory=dict)

    def success(self, task: str) -> None:
        self.succeeded.add(task)

    def failure(self, task: str, error: str | None, exception: EdgebuildError | None = None) -> None:
        """``error`` ``None``: not run, because a task it depends on failed. A
        :class:`SourceNotVerified` is a not-run too, with its reason kept."""
        if isinstance(exception, SourceNotVerified):
            self.not_run(task, str(exception))
            return
        self.failed[task] = error
        if exception is not None:
            self.exceptions[task] = exception

    def not_run(self, task: str, reason: str) -> None:
        self.failed[task] = None
        self.not_run_because[task] = reason

    def merged(self, other: "Outcomes") -> "Outcomes":
        """These outcomes and ``other``'s (a cluster's, say), ``other`` taking precedence
        for a task both ran."""
        merged = Outcomes(self.succeeded | other.succeeded, {**self.failed, **other.failed},
                          {**self.exceptions, **other.exceptions}, {**self.not_run_because, **other.not_run_because})
        merged.succeeded -= set(other.failed)
        return merged

    def verification(self, names: list[str]) -> dict[str, list[str]]:
        """``names`` sorted into passed (verified now or already), failed (its build or its
        verification failed) and not run (something it depends on failed -- its build, a
        source's build or a source's verification -- or the run stopped before reaching
        it). Tasks are ``NAME`` (its build) and ``verify:NAME``."""
        sorted_names: dict[str, list[str]] = {"passed": [], "failed": [], "not run": []}
        for name in names:
            own = [self.failed[task] for task in (name, f"verify:{name}") if task in self.failed]
            if any(error is not None for error in own):
                sorted_names["failed"].append(name)
            elif f"verify:{name}" in self.succeeded:
                sorted_names["passed"].append(name)
            else:
                sorted_names["not run"].append(name)
        return sorted_names

    def errors(self) -> dict[str, str]:
        return {task: error for task, error in self.failed.items() if error is not None}


def verification_summary(outcome: dict[str, list[str]]) -> str:
    """``verify: 2 passed, 1 failed (strict), 1 not run (strict_onnx)``"""
    parts = []
    for state in ("passed", "failed", "not run"):
        names = outcome[state]
        parts.append(f"{len(names)} {state}" + (f" ({', '.join(names)})" if names and state != "passed" else ""))
    return "verify: " + ", ".join(parts)


# --- the loop -----------------------------------------------------------------------------


# A step does one task's work: ``step(workspace, artifact, log, relay)``.
Step = Callable[["Workspace", Artifact, Log, Relay], object]


def run(workspace: "Workspace", artifacts: list[Artifact], verify_them: bool, fail_fast: bool = False,
        log: Callable[[str, str], None] | None = None, build_step: Step = build, verify_step: Step = verify) -> Outcomes:
    """Build ``artifacts`` and what they depend on (dependencies first), then, with
    ``verify_them``, verify each of ``artifacts``: one task at a time, in this process
    and its workers. A failure fails its task and skips what depends on it; the rest
    goes on unless ``fail_fast``. ``log(name, line)`` receives every line (default:
    stderr, as doit shows them).

    The loop decides (what needs building or verifying, what is blocked, what is
    recorded); ``build_step`` and ``verify_step`` do (default: :func:`build` and
    :func:`verify`, exports and judgements in worker processes). The scheduler's rules
    are tested with steps that do the same in this process."""
    outcomes = Outcomes()

    def step_log(artifact: Artifact) -> tuple[Log, Relay]:
        if log is None:
            return stderr_log(artifact.name), _stderr_relay
        prefix = f"[{artifact.name}] "

        def relay(stream: str, line: str) -> None:
            # A worker's own lines are "  [name] message", as doit shows them: the message.
            text = line.strip()
            if text:
                log(artifact.name, text.removeprefix(prefix))

        return (lambda message: log(artifact.name, message)), relay

    ordered = workspace.order(artifacts)
    tasks: list[tuple[str, Artifact, list[str]]] = [
        (artifact.name, artifact, [source.name for source in artifact.sources]) for artifact in ordered
    ]
    if verify_them:
        # Every artifact's verification waits for its sources' (the chain rule), so the
        # sources of those asked for are verified too, first.
        tasks += [(f"verify:{artifact.name}", artifact, verify_dependencies(artifact)) for artifact in ordered]
    stopped = False
    for task, artifact, depends_on in tasks:
        failed = [dependency for dependency in depends_on if dependency in outcomes.failed]
        if stopped or failed:
            if failed and failed[0].startswith("verify:"):
                outcomes.not_run(task, f"{artifact.name}: not run: its source {failed[0].removeprefix('verify:')} "
                                       "did not pass verification")
            else:
                outcomes.failure(task, None)
            continue
        step_log_to, relay = step_log(artifact)
        try:
            if task.startswith("verify:"):
                if needs_verify(workspace, artifact):
                    verify_step(workspace, artifact, step_log_to, relay)
            elif needs_build(workspace, artifact):
                build_step(workspace, artifact, step_log_to, relay)
            outcomes.success(task)
        except EdgebuildError as error:
            outcomes.failure(task, str(error), error)
            stopped = fail_fast
    return outcomes


def verify_dependencies(artifact: Artifact) -> list[str]:
    """The tasks ``verify:NAME`` waits for: its build, and its sources' verifications."""
    return [artifact.name, *(f"verify:{source.name}" for source in artifact.sources)]


def _stderr_relay(stream: str, line: str) -> None:
    import sys

    sys.stderr.write(line)
    sys.stderr.flush()
