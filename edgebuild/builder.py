"""Building and verifying one artifact, atomically.

A build writes into a fresh directory under ``build/.tmp/`` and is renamed
into ``build/<name>/`` only once every declared output and the record exist,
so nothing half-written ever looks built: a build killed at any point leaves
at most a stray temporary directory, which the next build ignores.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .errors import EdgebuildError, ExportError, VerificationFailed
from .kinds.base import BuildContext, VerifyContext
from .project import RECORD_FILE, RECORD_FORMAT, Project
from .report import Check, Report, read_report

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


def file_digest(path: Path) -> str:
    import blake3

    hasher = blake3.blake3()
    with open(path, "rb") as handle:
        while chunk := handle.read(16 * 1024 * 1024):
            hasher.update(chunk)
    return hasher.hexdigest()


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

    Cheap: compares fingerprints and file sizes; digests are checked by ``verify``.
    """
    existing = read_record(project.layout.artifact_dir(name))
    if existing is None or existing.get("fingerprint") != project.fingerprint(name):
        return False
    directory = project.layout.artifact_dir(name)
    for relative, meta in existing.get("outputs", {}).items():
        path = directory / relative
        if not path.is_file() or path.stat().st_size != meta["size"]:
            return False
    return True


def build_artifact(project: Project, name: str, log: Log | None = None) -> dict[str, Any]:
    """Build ``name`` unless it is current; return its record."""
    log = log or stderr_log(name)
    record = project.record(name)
    if is_built(project, name):
        log("up to date")
        return record
    params = project.manifest.artifacts[name]
    kind = project.kind(name)
    layout = project.layout
    scratch_root = layout.build_dir / ".tmp"
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=scratch_root))
    try:
        context = BuildContext(
            name=name,
            params=params,
            out_dir=scratch,
            checkpoints=project.checkpoints_for(params),
            sources={source: layout.artifact_dir(source) for source in params.source_artifacts()},
            input_root=project.manifest.root,
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
        (scratch / RECORD_FILE).write_text(json.dumps(complete, indent=2, sort_keys=True) + "\n")
        _replace_directory(scratch, layout.artifact_dir(name), scratch_root)
        log(f"built in {elapsed:.1f} s")
        return complete
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def _replace_directory(new: Path, target: Path, scratch_root: Path) -> None:
    """Move ``new`` to ``target``; an old ``target`` is moved aside first and removed after."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f"{target.name}.old.", dir=scratch_root))
        os.rename(target, old / "content")
    os.rename(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def is_verified(project: Project, name: str) -> bool:
    report = read_report(project.layout.artifact_dir(name))
    return bool(
        report
        and report.get("passed")
        and report.get("verify_fingerprint") == project.verify_fingerprint(name)
        and is_built(project, name)
    )


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
    checks = [_integrity_check(directory, built)]
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
    if not report.passed:
        failed = "; ".join(check.describe() for check in report.failed_checks)
        raise VerificationFailed(f"{name}: verification failed: {failed}")
    return report


def _integrity_check(directory: Path, built: dict[str, Any]) -> Check:
    """Every recorded output file still has its recorded digest (a tampered or truncated
    output fails verification with its name)."""
    recorded = built.get("outputs", {})
    changed = []
    for relative, meta in recorded.items():
        path = directory / relative
        if not path.is_file() or path.stat().st_size != meta["size"] or file_digest(path) != meta["digest"]:
            changed.append(relative)
    return Check.measure(
        "outputs_intact",
        len(recorded) - len(changed),
        "==",
        len(recorded),
        f"changed since build: {', '.join(changed)}" if changed else "every output matches its recorded digest",
    )
