"""The build record: what an artifact was built from and what the build wrote.

One record sits beside every built artifact (``build/<name>/.edgebuild.json``),
every store entry and every remote-cache entry. Its fingerprinted part -- kind,
canonical parameters, input fingerprints, build-code digests, tool versions --
hashes to the artifact's fingerprint; the rest (outputs, build info, timings)
is what the build produced, added afterwards. ``doit status`` explains a stale
artifact as the difference between two records.

A record is read from disk, from the store or from a remote, so it is validated
on read: a record of the wrong shape is a :class:`RecordError` that names the
file, never an ``AttributeError`` further on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgebuild.core.atomic import write_text
from edgebuild.core.files import RECORD_BYTES, UnreadableFile, parse_json, read_bytes, regular_file_below, regular_tree
from edgebuild.errors import RecordError
from edgebuild.core.hashing import digest_json, digest_json_sharing, file_digest, is_digest, written_file_digest

# 2: build and verify code digests apart; timings out of the payload files.
# 3: a source artifact is an input by its output digests, not its fingerprint (early cutoff).
RECORD_FORMAT = 3
RECORD_FILE = ".edgebuild.json"
# The files an artifact directory holds beside its outputs: the record and the report.
REPORT_FILES = ("report.json", "report.md")
# Files a command writes beside a build that are no part of it (never stored, pushed or
# published; a new build's directory goes without them): ``doit divergence``'s.
DERIVED_FILES = ("divergence.json",)
# The keys of a record that its fingerprint is the digest of.
FINGERPRINTED_KEYS = ("format", "kind", "params", "inputs", "code", "versions")
# A config string longer than this is kept by digest in ``config_values``.
CONFIG_VALUE_CHARS = 120
# A config mapping with more keys than this (a label table) is kept by digest, not by key.
CONFIG_SECTION_KEYS = 64


class OutputFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(ge=0)
    digest: str

    @field_validator("digest")
    @classmethod
    def _a_digest(cls, value: str) -> str:
        if not is_digest(value):
            raise ValueError("expected a blake3 digest (64 lowercase hex digits)")
        return value


class CheckpointOrigin(BaseModel):
    """Where a checkpoint came from, when it came from the Hugging Face cache: the repo,
    the revision the manifest asked for, the commit it resolved to, and each file read
    with its etag (its blob name; ``None`` for a file the cache keeps as a copy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hf: str
    revision: str
    commit: str
    files: dict[str, str | None]


class BuildRecord(BaseModel):
    """A build record. ``outputs`` is empty until the build has run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int
    kind: str
    params: dict[str, Any]
    inputs: dict[str, Any]
    code: dict[str, str]
    versions: dict[str, str]
    fingerprint: str
    # What the manifest named for each input (alias, path): for explanations, not hashed.
    inputs_named: dict[str, Any] = Field(default_factory=dict)
    # Per checkpoint role, the leaves of the config (section) it hashed, by dotted key:
    # scalars as they are, anything larger as its digest. For explanations ("config.json
    # vision_config.depth 2 -> 3"), not hashed (the config's digest in ``inputs`` is).
    config_values: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Per checkpoint role, the Hugging Face repo and commit it was read from: for
    # provenance, not hashed (the same files by path are the same artifact).
    checkpoint_origins: dict[str, CheckpointOrigin] = Field(default_factory=dict)
    artifact: str | None = None
    build_info: dict[str, Any] = Field(default_factory=dict)
    build_seconds: float | None = None
    outputs: dict[str, OutputFile] = Field(default_factory=dict)
    # The report files as verification wrote them, by size and digest, sealed when it
    # writes them (not hashed): a report that no longer holds these bytes is not the
    # verdict, whatever it says.
    reports: dict[str, OutputFile] = Field(default_factory=dict)

    @classmethod
    def create(cls, kind: str, params: dict[str, Any], inputs: dict[str, Any], code: dict[str, str],
               versions: dict[str, str], **explanations: Any) -> "BuildRecord":
        """The record of a build about to happen, with its fingerprint; ``explanations``: the
        fields it keeps that are not hashed (``inputs_named``, ``config_values``, ...)."""
        return cls(**cls.new_fields(kind, params, inputs, code, versions, **explanations))

    @staticmethod
    def new_fields(kind: str, params: dict[str, Any], inputs: dict[str, Any], code: dict[str, str],
                   versions: dict[str, str], **explanations: Any) -> dict[str, Any]:
        """What :meth:`create` makes its record of, the fingerprint among them, not yet
        validated: for a question about the fingerprint alone."""
        fingerprinted = {"format": RECORD_FORMAT, "kind": kind, "params": params, "inputs": inputs,
                         "code": code, "versions": versions}
        return {**fingerprinted, **explanations, "fingerprint": digest_json_sharing(fingerprinted)}

    def hashes_to(self) -> str:
        """The fingerprint the record's inputs hash to; a record fetched from elsewhere
        must hash to the fingerprint it is filed under."""
        return digest_json(self.to_json(only=FINGERPRINTED_KEYS))

    def completed(self, artifact: str, build_info: dict[str, Any], build_seconds: float,
                  outputs: dict[str, OutputFile]) -> "BuildRecord":
        return self.model_copy(update={"artifact": artifact, "build_info": build_info,
                                       "build_seconds": build_seconds, "outputs": outputs})

    def sealing_reports(self, directory: Path) -> "BuildRecord":
        """This record with the report files now in ``directory`` sealed (:attr:`reports`)."""
        sealed = {}
        for name in REPORT_FILES:
            info = regular_file_below(directory, name)
            if info is not None:
                sealed[name] = OutputFile(size=info.st_size, digest=file_digest(directory / name))
        return self.model_copy(update={"reports": sealed})

    def unsealed_report(self, directory: Path, digest: Callable[[Path], str] = file_digest) -> str | None:
        """Why the report files in ``directory`` are not the ones verification wrote and
        sealed (one line); ``None`` when every one holds its sealed bytes."""
        if not self.reports:
            return "its record seals no report (it was judged by an earlier edgebuild, or its verification was cut short)"
        changed = _changed_files(directory, self.reports, digest)
        if not changed:
            return None
        if regular_file_below(directory, changed[0]) is None:
            return f"{changed[0]} is missing or not a regular file"
        return f"{changed[0]} is not the file verification wrote (edited since: its digest is not the one its record seals)"

    def to_json(self, only: tuple[str, ...] | None = None) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        return {key: data[key] for key in only} if only is not None else data

    def write(self, directory: Path) -> None:
        write_text(directory / RECORD_FILE, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")

    def changed_outputs(self, directory: Path, digest: Callable[[Path], str] | None = file_digest) -> list[str]:
        """The recorded outputs missing from ``directory`` or whose size or digest no longer
        matches (empty when all match). ``digest=None`` compares sizes only (cheap); pass the
        stat cache's ``file_digest`` to skip files not written since they were last hashed."""
        return _changed_files(directory, self.outputs, digest)


def _changed_files(directory: Path, files: dict[str, OutputFile], digest: Callable[[Path], str] | None) -> list[str]:
    """The ``files`` (relative path -> size and digest) missing from ``directory`` or no
    longer holding those bytes; ``digest=None`` compares sizes only."""
    changed = []
    for relative, meta in files.items():
        # A link (to a file with the same bytes, even) is not the file that was written.
        info = regular_file_below(directory, relative)
        if info is None or info.st_size != meta.size:
            changed.append(relative)
        elif digest is not None and digest(directory / relative) != meta.digest:
            changed.append(relative)
    return changed


def config_leaves(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c": [..]}`` -> ``{"a.b": 1, "c": "<digest of the list>"}``: every
    leaf of a config by dotted key, a scalar as itself (a long string by digest), a list
    by its digest."""
    leaves: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and 0 < len(value) <= CONFIG_SECTION_KEYS:
            leaves |= config_leaves(value, f"{dotted}.")
        elif isinstance(value, (list, dict)) or (isinstance(value, str) and len(value) > CONFIG_VALUE_CHARS):
            leaves[dotted] = f"digest {digest_json(value)[:16]}"
        else:
            leaves[dotted] = value
    return leaves


def parse_record(text: str | bytes, where: str) -> BuildRecord:
    """A record from its JSON; :class:`RecordError` naming ``where`` if it is not one."""
    if len(text) > RECORD_BYTES:
        raise RecordError(f"{where}: not a build record ({len(text)} bytes, more than the {RECORD_BYTES} a record may hold)")
    try:
        data = parse_json(text)
    except UnreadableFile as error:
        raise RecordError(f"{where}: not a build record ({error})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{where}: not a build record (expected a JSON object, found {type(data).__name__})")
    if data.get("format") != RECORD_FORMAT:
        raise RecordError(f"{where}: a build record of format {data.get('format')!r}; this edgebuild reads format {RECORD_FORMAT}")
    try:
        return BuildRecord.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        location = " -> ".join(str(part) for part in first["loc"])
        raise RecordError(f"{where}: not a build record ({location}: {first['msg']})") from None


def read_record(directory: Path) -> BuildRecord | None:
    """The record in ``directory``; ``None`` when there is none; :class:`RecordError`
    when there is one of the wrong shape or an older format."""
    # A string: `doit status` asks this of every artifact, and pathlib's join was a tenth of it.
    path = os.path.join(directory, RECORD_FILE)
    try:
        text = read_bytes(path, RECORD_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UnreadableFile as error:
        raise RecordError(f"{path}: not a build record ({error})") from None
    except OSError as error:
        raise RecordError(f"{path}: cannot read the build record: {error.strerror}") from None
    return parse_record(text, path)


def read_record_or_none(directory: Path) -> BuildRecord | None:
    """The record in ``directory``, or ``None`` when it is missing or unreadable (a
    directory whose record cannot be read counts as not built, and is rebuilt)."""
    try:
        return read_record(directory)
    except RecordError:
        return None


def output_manifest(directory: Path) -> dict[str, OutputFile]:
    """Size and digest of every file a build's scratch directory holds (but the record,
    the report and hidden files): files this process just wrote, so hashed through a
    mapping on every core (:func:`written_file_digest`). :class:`NotRegular` for a link
    (or FIFO, socket, device) anywhere in it, hidden or not: outputs are regular files
    inside the build directory (``edgebuild/core/files.py``)."""
    skipped = {RECORD_FILE, *REPORT_FILES}
    files = {}
    for relative in regular_tree(directory):
        path = directory / relative
        if path.name not in skipped and not path.name.startswith("."):
            files[relative] = OutputFile(size=path.stat().st_size, digest=written_file_digest(path))
    return files
