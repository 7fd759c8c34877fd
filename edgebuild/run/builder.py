"""Building one artifact, atomically, through the store; keeping a verified one.

A build writes into a fresh directory under ``build/.tmp/`` and is renamed
into ``build/<name>/`` only once every declared output and the record exist,
so nothing half-written ever looks built: a build killed at any point leaves
at most a stray temporary directory, which the next build of it removes. A
per-artifact mutex keeps two doit processes from building the same artifact at
once; the second one waits, then finds it built.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

from edgebuild.core.atomic import new_directory, remove_leftovers
from edgebuild.errors import EdgebuildError, ExportError, FilesystemError, RemoteError, VerificationFailed
from edgebuild.core.faults import fault_point
from edgebuild.core.fingerprint import locked
from edgebuild.core.kind import BuildContext
from edgebuild.core.project import Project
from edgebuild.core.record import BuildRecord, output_manifest, read_record_or_none
from edgebuild.core.report import Report
from edgebuild.core.timing import peak_rss_bytes
from edgebuild.run.verification import judge

Log = Callable[[str], None]


class ExportRequired(Exception):
    """Raised by ``build_artifact(..., export=False)`` when neither the build directory,
    the store nor the remote cache has the artifact, so only an export would make it
    current. Not an :class:`EdgebuildError`: the caller decides (export in a worker
    process of its own, or refuse: ``--pull-only``)."""


def stderr_log(name: str) -> Log:
    def log(message: str) -> None:
        print(f"  [{name}] {message}", file=sys.stderr, flush=True)

    return log


def is_built(project: Project, name: str) -> bool:
    """Whether ``build/<name>/`` holds the outputs of the artifact's current fingerprint,
    each at its recorded digest.

    Through the stat cache: an output whose (device, inode, size, mtime, ctime) is
    unchanged since it was last hashed is not read again, while one edited in place,
    even at the same size, has a new ctime and is hashed, so it never counts as built.
    """
    existing = read_record_or_none(project.layout.artifact_dir(name))
    if existing is None or existing.fingerprint != project.fingerprint(name):
        return False
    return not _changed_outputs(project, name, existing)


def _changed_outputs(project: Project, name: str, record: BuildRecord) -> list[str]:
    return record.changed_outputs(project.layout.artifact_dir(name), digest=project.stat_cache.file_digest)


def build_artifact(project: Project, name: str, log: Log | None = None, export: bool = True) -> BuildRecord:
    """Make ``build/<name>/`` current: nothing if it is, a restore if the store has
    the fingerprint, a pull if the remote cache has it, a build otherwise (with
    ``export=False``: :class:`ExportRequired` instead). Returns the record.
    A file that cannot be written (a full disk, a read-only directory) is a
    :class:`FilesystemError` naming it; what was there before is untouched."""
    try:
        return _make_current(project, name, log or stderr_log(name), export)
    except OSError as error:
        raise FilesystemError.of(error, project.layout.artifact_dir(name), f"{name}: cannot build") from None


def _remember_outputs(project: Project, name: str, record: BuildRecord) -> BuildRecord:
    """Outputs just put in place hold their recorded bytes (hashed as they were written,
    or checked on restore): the stat cache takes their digests, so the next up-to-date
    check reads none of them."""
    directory = project.layout.artifact_dir(name)
    for relative, meta in record.outputs.items():
        project.stat_cache.remember(directory / relative, meta.digest)
    return record


def _make_current(project: Project, name: str, log: Log, export: bool) -> BuildRecord:
    record = project.record(name)
    with locked(project.layout.mutex(name)):
        if is_built(project, name):
            log("up to date")
            return record
        remove_leftovers(name, project.layout.scratch_dir)
        fingerprint = record.fingerprint
        target = project.layout.artifact_dir(name)
        existing = read_record_or_none(target)
        if existing is not None and existing.fingerprint == fingerprint:
            # The current build, damaged since (a file deleted, truncated or edited): say so, then replace it.
            damaged = ", ".join(_changed_outputs(project, name, existing))
            log(f"build/{name}: {damaged} changed or missing since the build; replacing it")
        started = time.perf_counter()
        restored = project.store.restore(fingerprint, target, project.layout.scratch_dir)
        if restored is not None:
            log(f"restored from the store in {time.perf_counter() - started:.2f} s (fingerprint {fingerprint[:12]})")
            return _remember_outputs(project, name, restored)
        if project.remote_cache is not None:
            pulled = _pull(project, name, fingerprint, target, log)
            if pulled is not None:
                log(
                    f"pulled from the remote cache {project.remote_cache.label} in "
                    f"{time.perf_counter() - started:.2f} s (fingerprint {fingerprint[:12]})"
                )
                return _remember_outputs(project, name, pulled)
        if not export:
            raise ExportRequired(name)
        complete = _build_into_place(project, name, record, log)
        project.store.put(fingerprint, target)
        return _remember_outputs(project, name, complete)


def _pull(project: Project, name: str, fingerprint: str, target: Path, log: Log) -> BuildRecord | None:
    remote = project.remote_cache
    try:
        return remote.pull(name, fingerprint, project.store, target, project.layout.scratch_dir, log)
    except RemoteError as error:
        raise RemoteError(f"{name}: {error} (EDGEBUILD_REMOTE_CACHE=off builds without the remote cache)") from None


def _build_into_place(project: Project, name: str, record: BuildRecord, log: Log) -> BuildRecord:
    kind = project.kind(name)
    layout = project.layout
    with new_directory(layout.artifact_dir(name), layout.scratch_dir) as scratch:
        context = BuildContext(**project.kind_inputs(name), out_dir=scratch, fingerprint=record.fingerprint, log=log)
        started = time.perf_counter()
        info = kind.build(context)
        elapsed = time.perf_counter() - started
        # The peak of the process that built it -- a worker process of its own
        # (edgebuild/workers.py), so the build's -- sizes cluster tasks and balances
        # shards (edgebuild/costs.py). In the record only, like the timings.
        info = {**info, "peak_rss_bytes": peak_rss_bytes()}
        missing = [output for output in kind.outputs if not (scratch / output).exists()]
        if missing:
            raise ExportError(f"{name}: the {kind.name} build did not write {', '.join(missing)}")
        complete = record.completed(name, info, elapsed, output_manifest(scratch))
        fault_point("build.before_record")
        # The record is written last: a directory without it never counts as built.
        complete.write(scratch)
        fault_point("build.before_rename")
    log(f"built in {elapsed:.1f} s")
    return complete


def verify_artifact(project: Project, name: str, log: Log | None = None) -> Report:
    """Verify the built ``name`` and write its report; keep a build that passed in the
    store and push it to the remote cache; raise :class:`VerificationFailed` on any
    failed check."""
    log = log or stderr_log(name)
    try:
        report = judge(project, name, log)
    except OSError as error:
        raise FilesystemError.of(error, project.layout.artifact_dir(name), f"{name}: cannot verify") from None
    fault_point("verify.after_report")
    print(report.summary(), file=sys.stderr, flush=True)
    if not report.passed:
        failed = "; ".join(check.describe() for check in report.failed_checks)
        raise VerificationFailed(f"{name}: verification failed: {failed}")
    _keep_verified(project, name, report.fingerprint, project.layout.artifact_dir(name), log)
    return report


def keep_verified(project: Project, name: str, log: Log | None = None) -> None:
    """Keep ``build/<name>/``, verified at its current verification fingerprint (a report
    that passed, pulled with the build or written here), in the store and push it."""
    _keep_verified(project, name, project.fingerprint(name), project.layout.artifact_dir(name), log or stderr_log(name))


def _keep_verified(project: Project, name: str, fingerprint: str, directory: Path, log: Log) -> None:
    """Keep a verified build in the store, with its report, and push it to the
    remote cache. Only verified builds are ever pushed."""
    if not project.store.has(fingerprint):
        # The store entry was pruned (or cache/ deleted) since the build.
        project.store.put(fingerprint, directory)
    project.store.put_report(fingerprint, directory)
    if project.remote_cache is not None:
        try:
            project.remote_cache.push(fingerprint, project.store, log)
        except OSError as error:
            raise FilesystemError.of(error, directory, f"{name}: verified, but not pushed to the remote cache") from None
        except EdgebuildError as error:
            raise type(error)(f"{name}: verified, but not pushed to the remote cache: {error}") from None
