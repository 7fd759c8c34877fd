"""Building and verifying one artifact, atomically, through the store.

A build writes into a fresh directory under ``build/.tmp/`` and is renamed
into ``build/<name>/`` only once every declared output and the record exist,
so nothing half-written ever looks built: a build killed at any point leaves
at most a stray temporary directory, which later builds ignore. A per-artifact
lock keeps two doit processes from building the same artifact at once; the
second one waits, then finds it built.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .errors import EdgebuildError, ExportError, RemoteError, VerificationFailed
from .fingerprint import file_digest, locked
from .kinds.base import BuildContext, VerifyContext
from .project import RECORD_FILE, RECORD_FORMAT, Project
from .report import Check, Report, read_report
from .store import changed_outputs, remove_leftovers, replace_directory, scratch_prefix

Log = Callable[[str], None]


def stderr_log(name: str) -> Log:
    def log(message: str) -> None:
        print(f"  [{name}] {message}", file=sys.stderr, flush=True)

    return log


def read_record(directory: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((directory / RECORD_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record if record.get("format") == RECORD_FORMAT else None


def output_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    """Size and digest of every file an artifact directory holds (but the record and reports)."""
    skipped = {RECORD_FILE, "report.json", "report.md"}
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name not in skipped and not path.name.startswith("."):
            relative = path.relative_to(directory).as_posix()
            files[relative] = {"size": path.stat().st_size, "digest": file_digest(path)}
    return files


def is_built(project: Project, name: str) -> bool:
    """Whether ``build/<name>/`` holds the outputs of the artifact's current fingerprint.

    Cheap (fingerprint and sizes); digests are checked by ``verify`` and on restore.
    """
    directory = project.layout.artifact_dir(name)
    existing = read_record(directory)
    if existing is None or existing.get("fingerprint") != project.fingerprint(name):
        return False
    return not changed_outputs(directory, existing.get("outputs", {}), digest=None)


def build_artifact(project: Project, name: str, log: Log | None = None) -> dict[str, Any]:
    """Make ``build/<name>/`` current: nothing if it is, a restore if the store has
    the fingerprint, a pull if the remote cache has it, a build otherwise. Returns the record."""
    log = log or stderr_log(name)
    record = project.record(name)
    with locked(project.layout.lock_file(name)):
        if is_built(project, name):
            log("up to date")
            return record
        remove_leftovers(name, project.layout.scratch_dir)
        fingerprint = record["fingerprint"]
        target = project.layout.artifact_dir(name)
        existing = read_record(target)
        if existing is not None and existing.get("fingerprint") == fingerprint:
            # The current build, damaged since (a truncated or deleted file): say so, then replace it.
            log(f"build/{name}: {', '.join(changed_outputs(target, existing.get('outputs', {}), digest=None))} missing or resized since the build; replacing it")
        started = time.perf_counter()
        restored = project.store.restore(fingerprint, target, project.layout.scratch_dir)
        if restored is not None:
            log(f"restored from the store in {time.perf_counter() - started:.2f} s (fingerprint {fingerprint[:12]})")
            return restored
        if project.remote_cache is not None:
            pulled = _pull(project, name, fingerprint, target, log)
            if pulled is not None:
                log(
                    f"pulled from the remote cache {project.remote_cache.label} in "
                    f"{time.perf_counter() - started:.2f} s (fingerprint {fingerprint[:12]})"
                )
                return pulled
        complete = _build_into_place(project, name, record, log)
        project.store.put(fingerprint, target)
        return complete


def _pull(project: Project, name: str, fingerprint: str, target: Path, log: Log) -> dict[str, Any] | None:
    remote = project.remote_cache
    try:
        return remote.pull(name, fingerprint, project.store, target, project.layout.scratch_dir, log)
    except RemoteError as error:
        raise RemoteError(f"{name}: {error} (EDGEBUILD_REMOTE_CACHE=off builds without the remote cache)") from None


def _build_into_place(project: Project, name: str, record: dict[str, Any], log: Log) -> dict[str, Any]:
    params = project.manifest.artifacts[name]
    kind = project.kind(name)
    layout = project.layout
    layout.scratch_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=scratch_prefix(name), dir=layout.scratch_dir))
    try:
        context = BuildContext(
            name=name,
            params=params,
            out_dir=scratch,
            checkpoints=project.checkpoints_for(params),
            sources={source: layout.artifact_dir(source) for source in params.source_artifacts()},
            input_root=project.manifest.root,
            fingerprint=record["fingerprint"],
            log=log,
        )
        started = time.perf_counter()
        info = kind.build(context)
        elapsed = time.perf_counter() - started
        missing = [output for output in kind.outputs if not (scratch / output).exists()]
        if missing:
            raise ExportError(f"{name}: the {kind.name} build did not write {', '.join(missing)}")
        complete = dict(record) | {
            "artifact": name,
            "build_info": info,
            "build_seconds": elapsed,
            "outputs": output_manifest(scratch),
        }
        # The record is written last: a directory without it never counts as built.
        (scratch / RECORD_FILE).write_text(json.dumps(complete, indent=2, sort_keys=True) + "\n")
        replace_directory(scratch, layout.artifact_dir(name), layout.scratch_dir)
        log(f"built in {elapsed:.1f} s")
        return complete
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def is_verified(project: Project, name: str) -> bool:
    report = read_report(project.layout.artifact_dir(name))
    return bool(
        report
        and report.get("passed")
        and report.get("verify_fingerprint") == project.verify_fingerprint(name)
        and is_built(project, name)
        and outputs_unchanged(project, name)
    )


def outputs_unchanged(project: Project, name: str) -> bool:
    """Whether every output of ``build/<name>/`` still has its recorded digest.

    Through the stat cache: a file not written since it was last hashed is not
    read again, while one edited in place (same size, new bytes) has a new
    ctime and is hashed, so a tampered output is never taken as verified.
    """
    directory = project.layout.artifact_dir(name)
    record = read_record(directory) or {}
    return not changed_outputs(directory, record.get("outputs", {}), digest=project.stat_cache.file_digest)


def verify_artifact(project: Project, name: str, log: Log | None = None) -> Report:
    """Verify the built ``name``; write its report; raise :class:`VerificationFailed` on any failed check."""
    log = log or stderr_log(name)
    record = project.record(name)
    directory = project.layout.artifact_dir(name)
    built = read_record(directory)
    if built is None or built.get("fingerprint") != record["fingerprint"]:
        raise EdgebuildError(f"{name}: build/{name} is not the current build; run `doit build {name}` first")
    params = project.manifest.artifacts[name]
    kind = project.kind(name)
    changed = changed_outputs(directory, built.get("outputs", {}))
    checks = [
        Check.measure(
            "outputs_intact",
            len(built.get("outputs", {})) - len(changed),
            "==",
            len(built.get("outputs", {})),
            f"changed since build: {', '.join(changed)}" if changed else "every output matches its recorded digest",
        )
    ]
    context = VerifyContext(
        name=name,
        params=params,
        out_dir=directory,
        checkpoints=project.checkpoints_for(params),
        sources={source: project.layout.artifact_dir(source) for source in params.source_artifacts()},
        input_root=project.manifest.root,
        build_info=built.get("build_info", {}),
        log=log,
    )
    started = time.perf_counter()
    verification = kind.verify(context)
    checks.extend(verification.checks)
    report = Report(
        artifact=name,
        kind=kind.name,
        fingerprint=record["fingerprint"],
        checks=checks,
        metrics=verification.metrics | {"verify_seconds": time.perf_counter() - started},
        build=built.get("build_info", {}),
        extra={"verify_fingerprint": project.verify_fingerprint(name), "verify": params.verify_parameters()},
    )
    report.write(directory)
    print(report.summary(), file=sys.stderr, flush=True)
    if report.passed and not changed:
        _keep_verified(project, name, record["fingerprint"], directory, log)
    if not report.passed:
        failed = "; ".join(check.describe() for check in report.failed_checks)
        raise VerificationFailed(f"{name}: verification failed: {failed}")
    return report


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
        except EdgebuildError as error:
            raise type(error)(f"{name}: verified, but not pushed to the remote cache: {error}") from None
