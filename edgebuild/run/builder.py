"""Building one artifact, atomically, through the store; judging it; keeping a verified one.

A build writes into a fresh directory under ``build/.tmp/`` and is renamed
into ``build/<name>/`` only once every declared output and the record exist,
so nothing half-written ever looks built: a build killed at any point leaves
at most a stray temporary directory, which the next build of it removes. A
per-artifact mutex keeps two doit processes from building the same artifact at
once; the second one waits, then finds it built.

This module does the work in whatever process calls it; which process that is
(the doit process for a restore or a pull, a worker process of its own for an
export or a verification) is the scheduler's decision (``scheduler.py``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from edgebuild.core.atomic import new_directory, remove_leftovers
from edgebuild.core.faults import fault_point
from edgebuild.core.files import NotRegular, regular_tree
from edgebuild.core.files import locked
from edgebuild.core.kind import BuildContext
from edgebuild.core.project import Artifact
from edgebuild.core.record import BuildRecord, output_manifest, read_record_or_none
from edgebuild.core.report import REPORT_JSON, Report
from edgebuild.core.timing import peak_rss_bytes
from edgebuild.errors import (
    BuildRejected, EdgebuildError, ExportError, FilesystemError, RemoteError, SourceNotVerified, UnvouchedEntry, VerificationFailed,
)
from edgebuild.run.state import changed_outputs, current_record, source_blocking
from edgebuild.run.verification import judge

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

Log = Callable[[str], None]
_Result = TypeVar("_Result")


def stderr_log(name: str) -> Log:
    def log(message: str) -> None:
        print(f"  [{name}] {message}", file=sys.stderr, flush=True)

    return log


def refused_export(workspace: "Workspace", artifact: Artifact) -> EdgebuildError:
    remote = workspace.remote
    where = remote.label if remote is not None else "no remote cache is set"
    return RemoteError(
        f"{artifact.name}: fingerprint {artifact.fingerprint[:12]} is neither built here, in the store nor in the "
        f"remote cache ({where}), and --pull-only exports nothing: the shard or cluster worker that builds "
        "it did not push it (did it run, and pass verification?)"
    )


def make_current(workspace: "Workspace", artifact: "Artifact", log: Log | None = None) -> BuildRecord:
    """Make ``build/<name>/`` current: nothing if it is, a restore if the store has
    the fingerprint, a pull if the remote cache has it, an export otherwise
    (:func:`materialise`, then :func:`export`, under one hold of the mutex). Returns the
    record. A file that cannot be written (a full disk, a read-only directory) is a
    :class:`FilesystemError` naming it; what was there before is untouched."""
    log = log or stderr_log(artifact.name)

    def current() -> BuildRecord:
        found = _materialise(workspace, artifact, log)
        return found if found is not None else _export(workspace, artifact, log)

    return _holding_mutex(workspace, artifact, current)


def materialise(workspace: "Workspace", artifact: Artifact, log: Log | None = None) -> BuildRecord | None:
    """Make ``build/<name>/`` current without exporting: nothing if it is, a restore
    from the store, a pull from the remote cache. ``None`` when only an export would
    do (the caller decides: export, in a worker process or here, or refuse)."""
    log = log or stderr_log(artifact.name)
    return _holding_mutex(workspace, artifact, lambda: _materialise(workspace, artifact, log))


def export(workspace: "Workspace", artifact: Artifact, log: Log | None = None) -> BuildRecord:
    """Export ``artifact`` into ``build/<name>/`` and keep it in the store, after
    :func:`materialise` found it nowhere. The remote cache is not asked again; the local
    state is, under the artifact's mutex: another command (sharing this project, or its
    store) may have built it while this one planned or waited for the mutex, and then
    it is up to date or restored, not exported twice."""
    log = log or stderr_log(artifact.name)

    def exported() -> BuildRecord:
        found = _materialise(workspace, artifact, log, remote=False)
        return found if found is not None else _export(workspace, artifact, log)

    return _holding_mutex(workspace, artifact, exported)


def _holding_mutex(workspace: "Workspace", artifact: Artifact, work: Callable[[], _Result]) -> _Result:
    """``work()`` under the artifact's mutex (one doit process builds it at a time); an
    ``OSError`` is a :class:`FilesystemError` naming the artifact's directory."""
    try:
        with locked(workspace.layout.mutex(artifact.name)):
            return work()
    except OSError as error:
        raise FilesystemError.of(error, artifact.directory, f"{artifact.name}: cannot build") from None


def _remember_outputs(workspace: "Workspace", artifact: Artifact, record: BuildRecord) -> BuildRecord:
    """Outputs just put in place hold their recorded bytes (hashed as they were written,
    or checked on restore): the stat cache takes their digests, so the next up-to-date
    check reads none of them."""
    for relative, meta in record.outputs.items():
        workspace.stat_cache.remember(artifact.directory / relative, meta.digest)
    return record


def _materialise(workspace: "Workspace", artifact: Artifact, log: Log, remote: bool = True) -> BuildRecord | None:
    """Under the artifact's mutex: up to date, restored, or (with ``remote``) pulled; ``None``."""
    record = artifact.record
    layout = workspace.layout
    if current_record(workspace, artifact) is not None:
        log("up to date")
        return record
    remove_leftovers(artifact.name, layout.scratch_dir)
    fingerprint = record.fingerprint
    target = artifact.directory
    existing = read_record_or_none(target)
    if existing is not None and existing.fingerprint == fingerprint:
        # The current build, damaged since (a file deleted, truncated or edited): say so, then replace it.
        damaged = ", ".join(changed_outputs(workspace, artifact, existing))
        log(f"build/{artifact.name}: {damaged} changed or missing since the build; replacing it")
    started = time.perf_counter()
    restored = workspace.store.restore(fingerprint, target, layout.scratch_dir, log)
    if restored is not None:
        log(f"restored from the store in {time.perf_counter() - started:.2f} s (fingerprint {fingerprint[:12]})")
        return _remember_outputs(workspace, artifact, restored)
    if not remote:
        return None
    try:
        # Opening it is reaching it: an unreachable remote fails here, as a pull would.
        cache = workspace.remote
        pulled = None
        if cache is not None:
            # A gather step that trusts keys takes only what they signed: it judges nothing.
            vouched_only = workspace.settings.pull_only and cache.trust.configured
            pulled = cache.pull(artifact.name, fingerprint, workspace.store, target, layout.scratch_dir, log,
                                vouched_only=vouched_only)
    except UnvouchedEntry:
        raise
    except RemoteError as error:
        raise RemoteError(
            f"{artifact.name}: {error} (EDGEBUILD_REMOTE_CACHE=off builds without the remote cache)"
        ) from None
    if pulled is None:
        return None
    log(f"pulled from the remote cache {cache.label} in {time.perf_counter() - started:.2f} s "
        f"(fingerprint {fingerprint[:12]})")
    return _remember_outputs(workspace, artifact, pulled)


def _export(workspace: "Workspace", artifact: Artifact, log: Log) -> BuildRecord:
    """Under the artifact's mutex, found nowhere: build it into place and store it."""
    record = artifact.record
    fingerprint = record.fingerprint
    rejected = workspace.store.rejection(fingerprint)
    if rejected is not None and not workspace.settings.retry_rejected:
        raise BuildRejected(f"{rejected['message']} [refused at this fingerprint on {rejected.get('at', '?')}: not "
                            "tried again until something in its fingerprint changes (EDGEBUILD_RETRY_REJECTED=1 "
                            "tries now)]")
    try:
        complete = _build_into_place(workspace, artifact, record, log)
    except BuildRejected as error:
        workspace.store.remember_rejection(fingerprint, str(error))
        raise
    workspace.store.forget_rejection(fingerprint)
    workspace.store.put(fingerprint, artifact.directory)
    return _remember_outputs(workspace, artifact, complete)


def _build_into_place(workspace: "Workspace", artifact: Artifact, record: BuildRecord, log: Log) -> BuildRecord:
    kind = artifact.kind
    layout = workspace.layout
    with new_directory(artifact.directory, layout.scratch_dir) as scratch:
        context = BuildContext(**workspace.kind_inputs(artifact), out_dir=scratch, fingerprint=record.fingerprint,
                               log=log)
        started = time.perf_counter()
        info = kind.build(context)
        elapsed = time.perf_counter() - started
        # The peak of the process that built it -- a worker process of its own
        # (edgebuild/run/workers.py), so the build's -- sizes cluster tasks and balances
        # shards (edgebuild/run/costs.py). In the record only, like the timings.
        info = {**info, "peak_rss_bytes": peak_rss_bytes()}
        # Before anything reads what it wrote (consumer.json opens its graphs): a link
        # would make the recorded, stored and published bytes some other file's.
        written = set(built_files(artifact.name, kind.name, scratch))
        missing = [output for output in kind.outputs if output not in written]
        if missing:
            raise ExportError(f"{artifact.name}: the {kind.name} build did not write {', '.join(missing)}")
        # How a deployment job feeds it, carried with the outputs everywhere they go.
        kind.write_consumer_contract(scratch, artifact.params, context.checkpoints, context.sources)
        complete = record.completed(artifact.name, info, elapsed, output_manifest(scratch))
        fault_point("build.before_record")
        # The record is written last: a directory without it never counts as built.
        complete.write(scratch)
        fault_point("build.before_rename")
    log(f"built in {elapsed:.1f} s")
    return complete


def refuse_unverified_sources(workspace: "Workspace", artifact: Artifact) -> None:
    """:class:`SourceNotVerified` when an artifact ``artifact`` is made from is not verified:
    its own verdict would not count, so it is not judged, kept or pushed."""
    blocking = source_blocking(workspace, artifact)
    if blocking is not None:
        source, why = blocking
        raise SourceNotVerified(f"{artifact.name}: not judged: {why}; it is judged once that one passes", source.name)


def built_files(name: str, kind: str, scratch: Path) -> list[str]:
    """The files a build wrote into ``scratch``; :class:`ExportError` naming a link (or a
    FIFO, socket, device) among them: outputs are regular files inside the build directory."""
    try:
        return regular_tree(scratch)
    except NotRegular as found:
        raise ExportError(
            f"{name}: the {kind} build left {found.relative} as {found}; outputs are regular files inside the build "
            "directory (nothing of this build was recorded or stored)"
        ) from None


# The checks that judge an artifact against the float model of its chain.
FLOAT_CHECKS = ("vs_float.", "dataset.")


def verify_artifact(workspace: "Workspace", artifact: "Artifact", log: Log | None = None) -> Report:
    """Judge the built ``artifact`` and write its report; keep a build that passed in the
    store and push it to the remote cache; raise :class:`VerificationFailed` on any
    failed check, and :class:`SourceNotVerified` (judging nothing) while an artifact it is
    made from is not verified."""
    log = log or stderr_log(artifact.name)
    refuse_unverified_sources(workspace, artifact)
    try:
        report = judge(workspace, artifact, log)
    except OSError as error:
        raise FilesystemError.of(error, artifact.directory, f"{artifact.name}: cannot verify") from None
    fault_point("verify.after_report")
    print(report.summary(), file=sys.stderr, flush=True)
    if not report.passed:
        try:
            # For `doit diff` to show this build's checks once it is the old side, in the
            # store's place for failed reports (never an entry: it counts as verified nowhere).
            workspace.store.keep_failed_report(artifact.fingerprint, artifact.directory / REPORT_JSON)
        except OSError:
            pass  # a read-only or full cache/ loses a diff's old values, not the verdict
        failed = "; ".join(check.describe() for check in report.failed_checks)
        # Judged against the float model and failed: where it leaves float is one command away.
        against_float = any(check.name.startswith(FLOAT_CHECKS) for check in report.failed_checks)
        where = f" (`doit divergence {artifact.name}` says at which module and step it leaves float)" \
            if against_float else ""
        raise VerificationFailed(f"{artifact.name}: verification failed: {failed}{where}")
    keep_verified(workspace, artifact, log)
    return report


def keep_verified(workspace: "Workspace", artifact: "Artifact", log: Log | None = None) -> None:
    """Keep ``build/<name>/``, verified at its current verification fingerprint (a report
    that passed, pulled with the build or written here), in the store with its report,
    and push it to the remote cache. Only verified builds are ever pushed."""
    log = log or stderr_log(artifact.name)
    # Only a build verified along its whole chain is kept as verified, or shared.
    refuse_unverified_sources(workspace, artifact)
    fingerprint = artifact.fingerprint
    directory = artifact.directory
    if not workspace.store.has(fingerprint):
        # The store entry was pruned (or cache/ deleted) since the build.
        workspace.store.put(fingerprint, directory)
    workspace.store.put_report(fingerprint, directory)
    try:
        remote = workspace.remote
        if remote is not None:
            remote.push(fingerprint, workspace.store, log)
    except OSError as error:
        raise FilesystemError.of(error, directory, f"{artifact.name}: verified, but not pushed to the remote cache") from None
    except EdgebuildError as error:
        raise type(error)(f"{artifact.name}: verified, but not pushed to the remote cache: {error}") from None
