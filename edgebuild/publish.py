"""``doit publish``: verified artifacts, with their provenance, at a shared destination.

Layout at the destination (a directory or any fsspec URL)::

    index.json                          every published artifact: fingerprint, checksum, when
    <artifact>/<fingerprint>/           the output files, as in build/<artifact>/
    <artifact>/<fingerprint>/report.json, report.md    its verification report
    <artifact>/<fingerprint>/provenance.json           what produced it (see ``provenance``)
    <artifact>/<fingerprint>/SHA256SUMS                ``sha256sum -c`` format, written last

The path is content-addressed: the fingerprint covers every input, so one key
never stands for two different builds. An entry counts as published once its
``SHA256SUMS`` exists; the index's ``checksum`` of an entry is the sha256 of
that file, so a downloaded artifact can be checked with shell tools alone
(``sha256sum SHA256SUMS``, then ``sha256sum -c SHA256SUMS``).

Rules: only artifacts that verified at their current fingerprint are published,
and only if every artifact asked for did (otherwise nothing is); a fingerprint
already published with the same output files is a no-op; one published with
different bytes is an error and is never overwritten.

Ordering and atomicity: entry files first, ``SHA256SUMS`` last, the index after
every entry. The index is read, merged and written back: on a filesystem under
a lock, through a temporary file renamed over it; on an object store (S3) in a
single PUT, which readers see whole or not at all. S3 has no lock and no
rename, so two publishers writing the index at the same instant can lose one
of the two new rows (never an entry): publishing that artifact again, a no-op
for its files, puts the row back.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from .errors import PublishError
from .fingerprint import locked
from .project import Project
from .record import VerificationState, read_record, verification_state
from .remote import Location
from .report import REPORT_JSON, REPORT_MD

PUBLISH_FORMAT = 1
INDEX_KEY = "index.json"
PROVENANCE_FILE = "provenance.json"
CHECKSUMS_FILE = "SHA256SUMS"
METADATA_FILES = (REPORT_JSON, REPORT_MD, PROVENANCE_FILE, CHECKSUMS_FILE)

Log = Callable[[str], None]


@dataclass(frozen=True)
class Published:
    artifact: str
    fingerprint: str
    path: str
    checksum: str
    # True when this run wrote the entry; False when it was already there.
    written: bool


@dataclass(frozen=True)
class _Prepared:
    """One artifact's files as they will be published."""

    name: str
    fingerprint: str
    directory: Path
    files: dict[str, bytes | Path]
    sha256: dict[str, str]
    checksums: bytes

    @property
    def prefix(self) -> str:
        return f"{self.name}/{self.fingerprint}"


def publish(project: Project, names: list[str], destination: str, log: Log = print) -> list[Published]:
    """Publish ``names`` to ``destination``; all of them or, if any is not verified, none."""
    check_publishable(project, names)
    location = Location(destination)
    git = git_state(project.manifest.root)
    prepared = [_prepare(project, name, git) for name in names]
    results = [_put_entry(location, item, log) for item in prepared]
    _update_index(location, project, results, log)
    return results


def check_publishable(project: Project, names: list[str]) -> None:
    """Raise :class:`PublishError` naming every artifact of ``names`` that may not be published."""
    problems = [problem for name in names if (problem := _unpublishable(project, name))]
    if problems:
        raise PublishError("nothing published:\n  " + "\n  ".join(problems))


def _unpublishable(project: Project, name: str) -> str | None:
    """Why ``name`` cannot be published (``None`` when it can)."""
    directory = project.layout.artifact_dir(name)
    state = verification_state(project, name)
    if state is VerificationState.FAILED:
        return f"{name}: verification failed (see build/{name}/report.md)"
    if state is not VerificationState.VERIFIED:
        return f"{name}: not verified at its current fingerprint (run `doit verify {name}`)"
    record = read_record(directory)
    changed = record.changed_outputs(directory) if record is not None else ["the build record"]
    if changed:
        return f"{name}: {', '.join(changed)} changed since it was built (run `doit verify {name}`)"
    return None


def _prepare(project: Project, name: str, git: dict[str, Any] | None) -> _Prepared:
    directory = project.layout.artifact_dir(name)
    record = read_record(directory)
    assert record is not None  # checked by _unpublishable
    outputs = sorted(record.outputs)
    clash = sorted(set(outputs) & set(METADATA_FILES))
    if clash:
        raise PublishError(f"{name}: output {clash[0]!r} has the name of a file publishing adds; rename the output")
    sha256 = {relative: file_sha256(directory / relative) for relative in outputs}
    provenance = provenance_record(project, name, record.to_json(), sha256, git)
    files: dict[str, bytes | Path] = {relative: directory / relative for relative in outputs}
    files[REPORT_JSON] = directory / REPORT_JSON
    files[REPORT_MD] = directory / REPORT_MD
    files[PROVENANCE_FILE] = (json.dumps(provenance, indent=2, sort_keys=True) + "\n").encode()
    for meta_name in (REPORT_JSON, REPORT_MD, PROVENANCE_FILE):
        content = files[meta_name]
        sha256[meta_name] = hashlib.sha256(content).hexdigest() if isinstance(content, bytes) else file_sha256(content)
    checksums = "".join(f"{sha256[relative]}  {relative}\n" for relative in sorted(sha256)).encode()
    return _Prepared(name, record.fingerprint, directory, files, sha256, checksums)


def provenance_record(
    project: Project, name: str, record: dict[str, Any], sha256: dict[str, str], git: dict[str, Any] | None
) -> dict[str, Any]:
    """What produced an artifact: enough to rebuild it, or to say why two differ."""
    params = project.manifest.artifacts[name]
    from .report import read_report

    report = read_report(project.layout.artifact_dir(name)) or {}
    manifest_path = project.manifest.path
    try:
        manifest_name = manifest_path.resolve().relative_to(project.manifest.root.resolve()).as_posix()
    except ValueError:
        manifest_name = manifest_path.name
    return {
        "format": PUBLISH_FORMAT,
        "artifact": name,
        "kind": record["kind"],
        "fingerprint": record["fingerprint"],
        "manifest": {
            "file": manifest_name,
            "entry": project.manifest.origins[name],
            # As validated: defaults filled in, description and thresholds included.
            "parameters": params.model_dump(mode="json"),
        },
        "params": record["params"],
        "inputs": record["inputs"],
        "code": record["code"],
        "verify_code": project.verify_code(name),
        "versions": record["versions"],
        "edgebuild_version": edgebuild_version(),
        "git": git,
        "build": record.get("build_info", {}),
        "verification": {
            "passed": report.get("passed"),
            "verify_fingerprint": report.get("verify_fingerprint"),
            "thresholds": report.get("verify"),
        },
        "outputs": {
            relative: {"size": meta["size"], "blake3": meta["digest"], "sha256": sha256[relative]}
            for relative, meta in sorted(record["outputs"].items())
        },
    }


def _put_entry(location: Location, item: _Prepared, log: Log) -> Published:
    checksum = "sha256:" + hashlib.sha256(item.checksums).hexdigest()
    prefix = item.prefix
    existing = location.read(f"{prefix}/{CHECKSUMS_FILE}")
    if existing is not None:
        published = _parse_checksums(existing)
        ours = {relative: item.sha256[relative] for relative in item.files if relative not in METADATA_FILES}
        theirs = {relative: digest for relative, digest in published.items() if relative not in METADATA_FILES}
        if theirs != ours:
            differing = sorted(relative for relative in set(ours) | set(theirs) if ours.get(relative) != theirs.get(relative))
            raise PublishError(
                f"{location.where(prefix)}: already published with different content "
                f"({', '.join(differing)}); not overwritten"
            )
        log(f"{item.name} {item.fingerprint[:12]} already published at {location.where(prefix)}")
        return Published(item.name, item.fingerprint, prefix + "/", "sha256:" + hashlib.sha256(existing).hexdigest(), False)
    # Not published yet: keys written by an interrupted earlier attempt are rewritten.
    for relative, content in sorted(item.files.items()):
        key = f"{prefix}/{relative}"
        if isinstance(content, bytes):
            location.write(key, content)
        else:
            location.upload(content, key)
    location.write(f"{prefix}/{CHECKSUMS_FILE}", item.checksums)
    log(f"published {item.name} {item.fingerprint[:12]} to {location.where(prefix)}")
    return Published(item.name, item.fingerprint, prefix + "/", checksum, True)


def _update_index(location: Location, project: Project, results: list[Published], log: Log) -> None:
    guard = locked(location.local_path(f".{INDEX_KEY}.lock")) if location.is_local else nullcontext()
    with guard:
        index = read_index(location)
        changed = False
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for result in results:
            rows = index["artifacts"].setdefault(result.artifact, {})
            if rows.get(result.fingerprint, {}).get("checksum") == result.checksum:
                continue
            rows[result.fingerprint] = {
                "path": result.path,
                "checksum": result.checksum,
                "kind": project.manifest.artifacts[result.artifact].kind,
                "published_at": now,
            }
            changed = True
        if changed:
            location.write(INDEX_KEY, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
            log(f"updated {location.where(INDEX_KEY)}")


def read_index(location: Location) -> dict[str, Any]:
    raw = location.read(INDEX_KEY)
    if raw is None:
        return {"format": PUBLISH_FORMAT, "artifacts": {}}
    try:
        index = json.loads(raw)
    except ValueError as error:
        raise PublishError(f"{location.where(INDEX_KEY)}: not valid JSON ({error}); not overwritten") from None
    if not isinstance(index, dict) or index.get("format") != PUBLISH_FORMAT or not isinstance(index.get("artifacts"), dict):
        found = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise PublishError(
            f"{location.where(INDEX_KEY)}: expected an index of format {PUBLISH_FORMAT}, found format {found!r}; not overwritten"
        )
    return index


def _parse_checksums(data: bytes) -> dict[str, str]:
    checksums = {}
    for line in data.decode("utf-8", errors="replace").splitlines():
        digest, _, relative = line.partition("  ")
        checksums[relative] = digest
    return checksums


def file_sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(16 * 1024 * 1024):
            hasher.update(chunk)
    return hasher.hexdigest()


def edgebuild_version() -> str:
    try:
        return metadata.version("edgebuild")
    except metadata.PackageNotFoundError:
        return "unknown"


def git_state(directory: Path) -> dict[str, Any] | None:
    """The commit ``directory`` is checked out at, and whether tracked files differ
    from it; ``None`` outside a git work tree (or without git)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, timeout=30
        )
        if commit.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory, capture_output=True, text=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
