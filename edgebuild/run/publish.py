"""``doit publish``: verified artifacts, with their provenance, at a shared destination.

Layout at the destination (a directory or any fsspec URL)::

    index.json                          every published artifact: fingerprint, checksum, commit, when;
                                        and the latest fingerprint of each
    <artifact>/<fingerprint>/           the output files, as in build/<artifact>/
    <artifact>/<fingerprint>/report.json, report.md    its verification report
    <artifact>/<fingerprint>/provenance.json           what produced it (see ``provenance``)
    <artifact>/<fingerprint>/provenance.intoto.json    the same as an in-toto SLSA statement (``release.py``)
    <artifact>/<fingerprint>/model.sig                 its model-signing signature, with a signing key
    <artifact>/<fingerprint>/SHA256SUMS                ``sha256sum -c`` format, written last

The path is content-addressed: the fingerprint covers every input, so one key
never stands for two different builds. An entry counts as published once its
``SHA256SUMS`` exists; the index's ``checksum`` of an entry is the sha256 of
that file, so a downloaded artifact can be checked with shell tools alone
(``sha256sum SHA256SUMS``, then ``sha256sum -c SHA256SUMS``).

Rules: only artifacts that verified at their current fingerprint are published,
and only if every artifact asked for did (otherwise nothing is); only from a
work tree whose commit says what produced them (no uncommitted changes, a
tracked manifest), unless ``allow_dirty`` -- which the provenance records; never
into the project's own ``build/`` or ``cache/``. A fingerprint already published with the
same output files is a no-op once every published file is checked against its
``SHA256SUMS``: a published file that no longer matches is an error naming it.
One published with different bytes is an error. Nothing published is ever
overwritten. (Checking reads every published file again: on S3, a download.)

Ordering and atomicity: an entry appears whole or not at all, and of two
publishers of one fingerprint exactly one writes it; the other finds it
published (and checks it like any republish).

- On a local filesystem the entry is written into a staging directory beside
  its final place (``<artifact>/.<fingerprint>.<random>.partial/``), then
  renamed into place; ``rename(2)`` refuses a target that exists. A killed
  publish leaves only its staging directory, never read and safe to delete.
- Elsewhere (S3 and other fsspec URLs) every key is written only where nothing
  is (S3: a conditional PUT, ``If-None-Match: *``), ``SHA256SUMS`` last, so no
  publisher overwrites another's file and the one that writes ``SHA256SUMS``
  lists exactly the bytes under the entry. A key written before by an
  interrupted publish is kept if it holds the same bytes (a retry); if it holds
  other bytes the publish stops and says to delete the unfinished entry.

The index is written after every entry: read, merged and written back, on a
filesystem under a lock, through a temporary file renamed over it; on an
object store (S3) in a single PUT, which readers see whole or not at all. S3
has no lock and no rename, so two publishers writing the index at the same
instant can lose one of the two new rows (never an entry): publishing that
artifact again, a no-op for its files, puts the row back.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from typing import TYPE_CHECKING

from edgebuild.cache.location import Location, UnfitObject, plain_path_problem, quoted
from edgebuild.cache.signing import load_private_key
from edgebuild.core.files import (
    RECORD_BYTES, REPORT_BYTES, NotRegular, UnreadableFile, describe_entry, json_kind, open_lock, open_regular, parse_json,
    regular_tree,
)
from edgebuild.core.faults import fault_point
from edgebuild.core.files import locked
from edgebuild.core.project import Artifact
from edgebuild.core.record import read_record
from edgebuild.core.report import REPORT_JSON, REPORT_MD, read_report, report_passed
from edgebuild.errors import EdgebuildError, PublishError, RemoteError
from edgebuild.run.state import VerificationState, refused_report, source_blocking, verification_state
from edgebuild.run.lockfile import lock_names
from edgebuild.run.release import SIGNATURE_FILE, STATEMENT_FILE, sign_entry, statement
from edgebuild.run.vcs import git_state, is_ignored, work_tree_top

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

PUBLISH_FORMAT = 1
INDEX_KEY = "index.json"
# An index row is ~200 bytes: this is hundreds of thousands of published entries.
INDEX_BYTES = 64 << 20
# A staging directory whose publisher died (a killed publish) is removed by the next
# publish of the same artifact; a live publisher holds an exclusive lock on its
# ``<staging>.lock`` for as long as it writes.
STAGING_SUFFIX = ".partial"
UNLOCKED_STAGING_SECONDS = 24 * 3600
PROVENANCE_FILE = "provenance.json"
CHECKSUMS_FILE = "SHA256SUMS"
METADATA_FILES = (REPORT_JSON, REPORT_MD, PROVENANCE_FILE, STATEMENT_FILE, SIGNATURE_FILE, CHECKSUMS_FILE)
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")

Log = Callable[[str], None]


@dataclass(frozen=True)
class Published:
    artifact: str
    fingerprint: str
    path: str
    checksum: str
    # True when this run wrote the entry; False when it was already there.
    written: bool
    # The commit it was published from, and whether the entry holds a signature.
    commit: str | None = None
    signed: bool = False


@dataclass(frozen=True)
class EntryFiles:
    """One artifact's files as they will be published: each file's content (bytes,
    or a local file), its sha256, and the ``SHA256SUMS`` that lists them all."""

    name: str
    fingerprint: str
    files: dict[str, bytes | Path]
    sha256: dict[str, str]
    checksums: bytes

    @classmethod
    def of(cls, name: str, fingerprint: str, files: dict[str, bytes | Path], sha256: dict[str, str] | None = None) -> "EntryFiles":
        """The entry of ``files``; ``sha256`` holds digests already known (the rest are computed)."""
        digests = dict(sha256 or {})
        for relative, content in files.items():
            if relative not in digests:
                digests[relative] = hashlib.sha256(content).hexdigest() if isinstance(content, bytes) else file_sha256(content)
        checksums = "".join(f"{digests[relative]}  {relative}\n" for relative in sorted(digests)).encode()
        return cls(name, fingerprint, files, digests, checksums)

    @property
    def prefix(self) -> str:
        return f"{self.name}/{self.fingerprint}"


def publish(workspace: "Workspace", artifacts: list[Artifact], destination: str, log: Log = print,
            allow_dirty: bool = False) -> list[Published]:
    """Publish ``artifacts`` to ``destination``; all of them or, if any is not verified, none.
    Refused from a work tree with uncommitted changes, or outside git, unless
    ``allow_dirty`` (which provenance.json then records)."""
    location = check_destination(workspace, destination)
    if workspace.settings.signing_key is not None:
        # Readable, one key, its owner's only: before anything is prepared.
        load_private_key(Path(workspace.settings.signing_key))
    git = check_work_tree(workspace, allow_dirty, artifacts)
    check_publishable(workspace, artifacts)
    if workspace.settings.signing_key is None:
        log("releases are unsigned (no EDGEBUILD_SIGNING_KEY): `python -m edgebuild fetch` refuses them")
    prepared = [_prepare(workspace, artifact, git) for artifact in artifacts]
    results = [put_entry(location, item, log) for item in prepared]
    results = [dataclasses.replace(result, commit=git.get("commit"), signed=SIGNATURE_FILE in item.files)
               for result, item in zip(results, prepared)]
    _update_index(location, workspace, results, log)
    return results


def check_destination(workspace: "Workspace", destination: str) -> Location:
    """The destination, checked before anything is built or written: a location that
    opens (an object store with a bucket), outside the project's ``build/`` and
    ``cache/`` and outside its git work tree (unless git ignores it there), with an
    index this version can merge into (or none yet)."""
    location = Location(destination, s3_endpoint=workspace.settings.s3_endpoint, setting="--to")
    _refuse_project_directories(workspace, location)
    _refuse_links(location)
    read_index(location)
    return location


def _refuse_links(location: Location) -> None:
    """Nothing is written through a link below a local destination (the rule of
    ``edgebuild/core/files.py``): an artifact's folder or the index linked elsewhere is
    refused here, before anything is built."""
    if not location.is_local:
        return
    root = location.local_path("")
    try:
        children = sorted(root.iterdir()) if root.is_dir() else []
    except OSError:
        return  # read_index, next, names what cannot be read
    for child in children:
        if child.is_symlink():
            raise PublishError(f"{child}: {describe_entry(child, os.lstat(child).st_mode)}; publishing writes real files "
                               "and folders inside the destination and never through a link: remove the link")


def _refuse_project_directories(workspace: "Workspace", location: Location) -> None:
    """A destination inside ``build/`` or ``cache/`` would be replaced, cleaned or
    pruned by edgebuild itself: published files must outlive those. One inside the git
    work tree would add untracked files to the repository (``--to .``)."""
    if not location.is_local:
        return
    root = Path(location.root).resolve()
    for directory in (workspace.layout.build_dir, workspace.layout.cache_dir):
        if root.is_relative_to(directory.resolve()):
            raise PublishError(
                f"{location.label}: inside the project's {directory.name}/ directory, which edgebuild "
                "replaces and prunes; publish somewhere else"
            )
    top = work_tree_top(workspace.manifest.root)
    if top is not None and root.is_relative_to(top.resolve()) and not is_ignored(top, root):
        raise PublishError(
            f"{location.label}: inside the git work tree {top}, where published files would be untracked "
            "files of the repository; publish outside it, or into a folder its .gitignore ignores"
        )


def check_publishable(workspace: "Workspace", artifacts: list[Artifact]) -> None:
    """Raise :class:`PublishError` naming every one of ``artifacts`` that may not be published."""
    problems = [problem for artifact in artifacts if (problem := _unpublishable(workspace, artifact))]
    if problems:
        raise PublishError("nothing published:\n  " + "\n  ".join(problems))


def _unpublishable(workspace: "Workspace", artifact: Artifact) -> str | None:
    """Why ``artifact`` cannot be published (``None`` when it can)."""
    name = artifact.name
    directory = artifact.directory
    state = verification_state(workspace, artifact)
    if state is VerificationState.FAILED:
        return f"{name}: verification failed (see build/{name}/report.md)"
    blocking = source_blocking(workspace, artifact) if state is not VerificationState.VERIFIED else None
    if blocking is not None:
        return f"{name}: not verified while {blocking[1]}"
    if state is not VerificationState.VERIFIED:
        refused = refused_report(workspace, artifact)
        if refused is not None:
            return f"{name}: {refused} (run `doit verify {name}`; nothing is signed that verification did not write)"
        return f"{name}: not verified at its current fingerprint (run `doit verify {name}`)"
    record = read_record(directory)
    changed = record.changed_outputs(directory) if record is not None else ["the build record"]
    if changed:
        return f"{name}: {', '.join(changed)} changed since it was built (run `doit verify {name}`)"
    try:
        # The report files are published too: regular files here, like the outputs.
        regular_tree(directory)
    except NotRegular as found:
        return f"{name}: build/{name}/{found.relative} is {found}; only regular files are published (remove it, then run `doit verify {name}`)"
    return None


def _prepare(workspace: "Workspace", artifact: Artifact, git: dict[str, Any]) -> EntryFiles:
    name = artifact.name
    directory = artifact.directory
    record = read_record(directory)
    assert record is not None  # checked by _unpublishable
    outputs = sorted(record.outputs)
    clash = sorted(set(outputs) & set(METADATA_FILES))
    if clash:
        raise PublishError(f"{name}: output {clash[0]!r} has the name of a file publishing adds; rename the output")
    sha256 = {relative: file_sha256(directory / relative) for relative in outputs}
    provenance = provenance_record(workspace, artifact, record.to_json(), sha256, git)
    files: dict[str, bytes | Path] = {relative: directory / relative for relative in outputs}
    files[REPORT_JSON] = directory / REPORT_JSON
    files[REPORT_MD] = directory / REPORT_MD
    files[PROVENANCE_FILE] = (json.dumps(provenance, indent=2, sort_keys=True) + "\n").encode()
    subjects = EntryFiles.of(name, record.fingerprint, files, sha256).sha256
    files[STATEMENT_FILE] = (json.dumps(statement(provenance, subjects), indent=2, sort_keys=True) + "\n").encode()
    signing_key = workspace.settings.signing_key
    if signing_key is not None:
        files[SIGNATURE_FILE] = sign_entry(files, Path(signing_key), workspace.layout.scratch_dir)
    return EntryFiles.of(name, record.fingerprint, files, subjects)


def provenance_record(
    workspace: "Workspace", artifact: Artifact, record: dict[str, Any], sha256: dict[str, str], git: dict[str, Any]
) -> dict[str, Any]:
    """What produced an artifact: enough to rebuild it, or to say why two differ."""
    name = artifact.name
    manifest = workspace.manifest
    report = read_report(artifact.directory) or {}
    manifest_path = manifest.path
    try:
        manifest_name = manifest_path.resolve().relative_to(manifest.root.resolve()).as_posix()
    except ValueError:
        manifest_name = manifest_path.name
    return {
        "format": PUBLISH_FORMAT,
        "artifact": name,
        "kind": record["kind"],
        "fingerprint": record["fingerprint"],
        "manifest": {
            "file": manifest_name,
            "entry": manifest.origins[name],
            # As validated: defaults filled in, description and thresholds included.
            "parameters": artifact.params.model_dump(mode="json"),
        },
        "params": record["params"],
        "inputs": record["inputs"],
        # The Hugging Face repo, commit and file etags of each hf: checkpoint, as the
        # manifest resolves them now (the same bytes as the built record's inputs).
        "checkpoint_origins": artifact.record.to_json(only=("checkpoint_origins",))["checkpoint_origins"],
        # What `doit diff --against DEST` names changes by: the input files' paths, the
        # sources' names, the checkpoints' config leaves.
        "inputs_named": lock_names(artifact),
        "config_values": artifact.record.config_values,
        "code": record["code"],
        "verify_code": workspace.verify_code(artifact),
        "versions": record["versions"],
        "edgebuild_version": edgebuild_version(),
        "git": git,
        "build": record.get("build_info", {}),
        "verification": {
            "passed": report_passed(report),
            "verify_fingerprint": report.get("verify_fingerprint"),
            "thresholds": report.get("verify"),
            # The verdicts of the artifacts it is made from, when it was judged: a release
            # counts only with every one of them passed (a fetch checks).
            "chain": report.get("chain", []),
        },
        "outputs": {
            relative: {"size": meta["size"], "blake3": meta["digest"], "sha256": sha256[relative]}
            for relative, meta in sorted(record["outputs"].items())
        },
    }


def put_entry(location: Location, item: EntryFiles, log: Log) -> Published:
    """Publish one entry, or find it already published (and check it: see
    :func:`_check_published`)."""
    if _published_checksums(location, item) is None:
        write = _write_entry_by_rename if location.is_local else _write_entry_create_only
        if write(location, item):
            log(f"published {item.name} {item.fingerprint[:12]} to {location.where(item.prefix)}")
            return Published(item.name, item.fingerprint, item.prefix + "/", _checksum(item.checksums), True)
        # Another publisher wrote it first: from here on, like any republish.
    existing = _check_published(location, item)
    log(f"{item.name} {item.fingerprint[:12]} already published at {location.where(item.prefix)}")
    return Published(item.name, item.fingerprint, item.prefix + "/", _checksum(existing), False)


def _published_checksums(location: Location, item: EntryFiles) -> bytes | None:
    """The ``SHA256SUMS`` published for ``item``; ``None`` when there is none. A FIFO or a
    directory there is a :class:`PublishError` (read, never waited on; never overwritten)."""
    try:
        return location.read(f"{item.prefix}/{CHECKSUMS_FILE}")
    except UnfitObject as unfit:
        where = location.where(item.prefix)
        raise PublishError(f"{where}: {CHECKSUMS_FILE} is {unfit.what}; not overwritten (delete {where}/ and publish "
                           "again)") from None


def _write_entry_by_rename(location: Location, item: EntryFiles) -> bool:
    """Write the entry into a staging directory beside its final place, then rename
    it into place; ``False`` when another publisher's entry got there first."""
    where = location.where(item.prefix)
    final = location.local_path(item.prefix)
    # Outside the final path, so that a killed publish leaves nothing inside an entry.
    staging = location.local_path(f"{item.name}/.{item.fingerprint}.{uuid.uuid4().hex}{STAGING_SUFFIX}")
    staging.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_staging(staging.parent)
    try:
        ownership = open_lock(Path(f"{staging}.lock"))
    except OSError as error:
        raise RemoteError(f"{where}: cannot write: {error}") from None
    fcntl.flock(ownership, fcntl.LOCK_EX)
    try:
        try:
            staging.mkdir(parents=True)
            for relative, content in sorted(item.files.items()):
                target = staging / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(content, bytes):
                    target.write_bytes(content)
                else:
                    shutil.copyfile(content, target)
            (staging / CHECKSUMS_FILE).write_bytes(item.checksums)
        except OSError as error:
            raise RemoteError(f"{where}: cannot write: {error}") from None
        fault_point("publish.after_files")
        try:
            # rename(2) replaces nothing but an empty directory: of two publishers, one wins.
            os.rename(staging, final)
        except OSError as error:
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False
            raise RemoteError(f"{where}: cannot write: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        Path(f"{staging}.lock").unlink(missing_ok=True)
        ownership.close()
    return True


def _remove_abandoned_staging(folder: Path) -> None:
    """Remove the staging directories under ``folder`` that no publisher holds: left by
    a publish that was killed. One whose lock is held is another publisher's, at work."""
    for lock in folder.glob(f".*{STAGING_SUFFIX}.lock"):
        staging = Path(str(lock)[: -len(".lock")])
        try:
            handle = open_lock(lock)
        except OSError:
            continue  # not a lock of ours (a FIFO, a directory): never waited on, never removed
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a publish running now
            shutil.rmtree(staging, ignore_errors=True)
            lock.unlink(missing_ok=True)
    # Without a lock file: left by an edgebuild that took no locks, or (for an instant)
    # a publisher whose lock another cleaner just removed. Only an old one is abandoned.
    for staging in folder.glob(f".*{STAGING_SUFFIX}"):
        try:
            age = time.time() - staging.stat().st_mtime
        except OSError:
            continue
        if staging.is_dir() and not Path(f"{staging}.lock").exists() and age > UNLOCKED_STAGING_SECONDS:
            shutil.rmtree(staging, ignore_errors=True)


def _write_entry_create_only(location: Location, item: EntryFiles) -> bool:
    """Write every file only where nothing is, ``SHA256SUMS`` last; ``False`` when
    another publisher's ``SHA256SUMS`` got there first. Since no key is ever
    overwritten, whoever writes ``SHA256SUMS`` lists the bytes that are there."""
    where = location.where(item.prefix)
    for relative, content in sorted(item.files.items()):
        key = f"{item.prefix}/{relative}"
        if location.create(key, content):
            continue
        # Already written: by an interrupted publish of these same bytes (a retry), kept;
        # or by another publisher, which may have finished meanwhile.
        if location.digest(key, hashlib.sha256()) == item.sha256[relative]:
            continue
        if _published_checksums(location, item) is not None:
            return False
        raise PublishError(
            f"{where}: {relative} holds other bytes, from another publish of this fingerprint that is "
            f"unfinished or still running; not overwritten (delete {where}/ if no publish is running)"
        )
    fault_point("publish.after_files")
    return location.create(f"{item.prefix}/{CHECKSUMS_FILE}", item.checksums)


def _check_published(location: Location, item: EntryFiles) -> bytes:
    """The ``SHA256SUMS`` of the published entry of ``item``, after checking that it
    lists the same outputs as ``item`` and that every file it lists holds the bytes
    it says. Raises :class:`PublishError` otherwise: nothing published is overwritten."""
    where = location.where(item.prefix)
    existing = _published_checksums(location, item)
    if existing is None:
        raise PublishError(
            f"{where}: holds files but no {CHECKSUMS_FILE} (a publish that was interrupted or is still running); "
            f"not overwritten (delete {where}/ if no publish is running)"
        )
    published = parse_checksums(existing, f"{where}/{CHECKSUMS_FILE}")
    ours = {relative: item.sha256[relative] for relative in item.files if relative not in METADATA_FILES}
    theirs = {relative: digest for relative, digest in published.items() if relative not in METADATA_FILES}
    if theirs != ours:
        differing = sorted(relative for relative in set(ours) | set(theirs) if ours.get(relative) != theirs.get(relative))
        raise PublishError(
            f"{where}: already published with different content ({', '.join(differing)}); not overwritten"
        )
    for relative, digest in sorted(published.items()):
        try:
            found = location.digest(f"{item.prefix}/{relative}", hashlib.sha256())
        except UnfitObject as unfit:
            found, state = None, f"is {unfit.what}"
        else:
            state = "is missing" if found is None else f"does not match {CHECKSUMS_FILE}"
        if found != digest:
            raise PublishError(
                f"{where}: published file {relative} {state}; not overwritten (delete {where}/ and publish again)"
            )
    return existing


def _checksum(checksums: bytes) -> str:
    """How the index names an entry's content: the sha256 of its ``SHA256SUMS``."""
    return "sha256:" + hashlib.sha256(checksums).hexdigest()


def _update_index(location: Location, workspace: "Workspace", results: list[Published], log: Log) -> None:
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
                "kind": workspace.manifest.artifacts[result.artifact].kind,
                "published_at": now,
                "commit": result.commit,
                "signed": result.signed,
            }
            changed = True
        latest = index.setdefault("latest", {})
        for result in results:
            # What a consumer's `fetch NAME` takes: the fingerprint published last.
            if latest.get(result.artifact) != result.fingerprint:
                latest[result.artifact] = result.fingerprint
                changed = True
        if changed:
            location.write(INDEX_KEY, (json.dumps(index, indent=2, sort_keys=True) + "\n").encode())
            log(f"updated {location.where(INDEX_KEY)}")


def read_index(location: Location) -> dict[str, Any]:
    where = location.where(INDEX_KEY)
    try:
        raw = location.read(INDEX_KEY, limit=INDEX_BYTES)
    except UnfitObject as error:
        raise PublishError(f"{error}; expected the destination's {INDEX_KEY}, not overwritten") from None
    if raw is None:
        return {"format": PUBLISH_FORMAT, "artifacts": {}}
    try:
        index = parse_json(raw)
    except UnreadableFile as error:
        raise PublishError(f"{where}: {error}; not overwritten") from None
    problem = _index_problem(index)
    if problem:
        raise PublishError(f"{where}: {problem}; not overwritten")
    return index


def latest_published(index: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Artifact -> (fingerprint, index row) of its most recently published build: the
    index's ``latest`` pointer, or (an index written before it had one) the newest row."""
    latest = {}
    pointers = index.get("latest", {})
    for name, rows in index["artifacts"].items():
        if pointers.get(name) in rows:
            latest[name] = (pointers[name], rows[pointers[name]])
            continue
        dated = [(str(row.get("published_at", "")), fingerprint, row) for fingerprint, row in rows.items()]
        if dated:
            _, fingerprint, row = max(dated, key=lambda item: (item[0], item[1]))
            latest[name] = (fingerprint, row)
    return latest


def published_build(location: Location, name: str, fingerprint: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """What the published build of ``name`` at ``fingerprint`` was -- its provenance as a
    build record's fields (kind, params, inputs, code, versions, outputs) and its report --
    each read bounded and checked against the entry's ``SHA256SUMS``; ``None`` for what is
    missing or does not match. For `doit diff --against DEST`: reading, never trusting."""
    prefix = f"{name}/{fingerprint}"
    try:
        listed = location.read(f"{prefix}/{CHECKSUMS_FILE}", limit=RECORD_BYTES)
        checksums = parse_checksums(listed, location.where(prefix)) if listed is not None else {}
    except (UnfitObject, PublishError):
        return None, None

    def checked(relative: str, limit: int) -> Any:
        try:
            data = location.read(f"{prefix}/{relative}", limit=limit)
        except UnfitObject:
            return None
        if data is None or hashlib.sha256(data).hexdigest() != checksums.get(relative):
            return None
        try:
            value = parse_json(data)
        except UnreadableFile:
            return None
        return value if isinstance(value, dict) and value.get("fingerprint") == fingerprint else None

    provenance, report = checked(PROVENANCE_FILE, RECORD_BYTES), checked(REPORT_JSON, REPORT_BYTES)
    record = None
    if provenance is not None and isinstance(provenance.get("outputs"), dict):
        record = {key: provenance.get(key) for key in ("kind", "fingerprint", "params", "inputs", "code", "versions",
                                                        "inputs_named", "config_values") if key in provenance}
        record["outputs"] = {relative: {"size": meta.get("size"), "digest": meta.get("blake3")}
                             for relative, meta in provenance["outputs"].items() if isinstance(meta, dict)}
    return record, report


def _index_problem(index: Any) -> str | None:
    """What keeps ``index`` from being an index this version reads and merges into."""
    if not isinstance(index, dict):
        return f"expected an index of format {PUBLISH_FORMAT} (an object), found {json_kind(index)}"
    if index.get("format") != PUBLISH_FORMAT:
        return f"expected an index of format {PUBLISH_FORMAT}, found format {quoted(index.get('format'))}"
    artifacts = index.get("artifacts")
    if not isinstance(artifacts, dict):
        return f"'artifacts' is {json_kind(artifacts)}, expected an object"
    for name, rows in artifacts.items():
        if not isinstance(rows, dict):
            return f"artifacts[{quoted(name)}] is {json_kind(rows)}, expected an object of fingerprints"
        for fingerprint, row in rows.items():
            if not isinstance(row, dict):
                return f"artifacts[{quoted(name)}][{quoted(fingerprint)}] is {json_kind(row)}, expected an object"
    latest = index.get("latest", {})
    if not isinstance(latest, dict):
        return f"'latest' is {json_kind(latest)}, expected an object of fingerprints"
    for name, fingerprint in latest.items():
        if not isinstance(fingerprint, str) or fingerprint not in artifacts.get(name, {}):
            return f"latest[{quoted(name)}] is {quoted(fingerprint)}, not a fingerprint the index lists for it"
    return None


def parse_checksums(data: bytes, where: str) -> dict[str, str]:
    """The file -> sha256 of a ``SHA256SUMS`` read from a destination, whose file names
    become keys: anything but ``<64 hex>  <plain relative path>`` lines is refused."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise PublishError(f"{where}: not UTF-8 text; not overwritten") from None
    checksums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        digest, separator, relative = line.partition("  ")
        if not separator or not SHA256_PATTERN.fullmatch(digest) or plain_path_problem(relative) or relative in checksums:
            raise PublishError(f"{where}: line {number} is not '<sha256>  <file>' for a new file; not overwritten")
        checksums[relative] = digest
    return checksums


def file_sha256(path: Path) -> str:
    hasher = hashlib.sha256()
    with open_regular(path) as handle:
        while chunk := handle.read(16 * 1024 * 1024):
            hasher.update(chunk)
    return hasher.hexdigest()


def edgebuild_version() -> str:
    try:
        return metadata.version("edgebuild")
    except metadata.PackageNotFoundError:
        return "unknown"


def check_work_tree(workspace: "Workspace", allow_dirty: bool = False, artifacts: "list[Artifact] | tuple[()]" = ()) -> dict[str, Any]:
    """The provenance's ``git``: the commit the manifest's work tree is at, whether it
    differs from it, and whether that was allowed. Raises :class:`PublishError` when
    no commit says what produced the artifacts -- uncommitted changes to tracked
    files, an untracked manifest, an untracked input file that ``artifacts`` (or what they
    are made from) read, no commit, no git -- unless ``allow_dirty``.

    The lock file is left out: ``doit verify`` rewrites it just before publishing,
    and it describes the outputs, not what produced them. Checkpoints are too: they
    are recorded by content (and Hugging Face commit) in the provenance itself."""
    inputs: list[Path] = []
    for artifact in artifacts:
        try:
            inputs += workspace.input_paths(artifact)
        except EdgebuildError:
            continue  # an artifact that cannot be read is refused by verification, by name
    state = git_state(workspace.manifest.root, ignore=(workspace.lock_path,),
                      tracked=(workspace.manifest.path, *dict.fromkeys(inputs)))
    commit = state["commit"] if state else None
    changes = state["changes"] if state else []
    record = {"commit": commit, "dirty": bool(changes) if state else None, "allow_dirty": allow_dirty}
    if allow_dirty:
        return record
    advice = "commit, or pass --allow-dirty to publish anyway (recorded in provenance.json)"
    if state is None:
        raise PublishError(
            f"{workspace.manifest.root} is not in a git work tree, so no commit records what produced "
            f"these artifacts; {advice}"
        )
    if commit is None:
        raise PublishError(f"the git repository at {state['top']} has no commit yet; {advice}")
    if changes:
        shown = ", ".join(changes[:5]) + (f" and {len(changes) - 5} more" if len(changes) > 5 else "")
        raise PublishError(f"the work tree has uncommitted changes ({shown}); {advice}")
    return record


