"""A consumer's fetch: a published artifact, checked byte for byte and by signature.

``python -m edgebuild fetch NAME --from DEST --to DIR`` (or :func:`fetch`) picks a
published build of ``NAME`` from the destination's ``index.json`` -- its ``latest``
pointer, a fingerprint, or the newest one published from a commit -- downloads the
entry into a scratch directory beside ``DIR``, and checks, before anything is put at
``DIR``:

- the entry's ``SHA256SUMS`` against the index's checksum of it;
- every file it lists against its sha256, and that nothing else is there;
- its ``model.sig`` (``release.py``) against the trusted keys (``EDGEBUILD_TRUSTED_KEYS``):
  an unsigned release, one signed by another key, or one whose files differ from what
  was signed is refused;
- its verdict: ``report.json`` passed and, for an artifact made from a source, the
  verdict it records of every artifact up its chain passed too (``provenance.json``
  says which are sources). A QNN context published while its QDQ graph had failed --
  what an edgebuild before the chain rule published -- is refused, whichever
  ``latest`` says.

Then the scratch directory is renamed to ``DIR``: it appears whole, or not at all. A
``DIR`` that exists and is not empty, or that is a symbolic link (to a directory, or to
nothing), is refused before anything is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from edgebuild.cache.location import FROM_SETTINGS, Location
from edgebuild.cache.signing import load_public_key
from edgebuild.core.files import RECORD_BYTES, REPORT_BYTES, UnreadableFile, describe_entry, read_json
from edgebuild.core.report import REPORT_JSON, verdict_problem
from edgebuild.errors import FetchError, PublishError
from edgebuild.run.publish import (
    CHECKSUMS_FILE, PROVENANCE_FILE, file_sha256, latest_published, parse_checksums, read_index,
)
from edgebuild.run.release import release_distrust

# A SHA256SUMS lists a few files: kilobytes. Read no more than this.
CHECKSUMS_BYTES = 1 << 20
SHORTEST_PREFIX = 7

Log = Callable[[str], None]


def choose(index: dict, name: str, where: str, fingerprint: str | None = None, commit: str | None = None) -> str:
    """The fingerprint of ``name`` to fetch: ``fingerprint`` (or a unique prefix of it),
    the newest published from ``commit`` (or a prefix of at least 7 hex digits), or the
    latest published."""
    if not index["artifacts"]:
        raise FetchError(f"{name}: nothing is published at {where} (no index.json there: is it where `doit publish --to` "
                         "published?)")
    rows = index["artifacts"].get(name)
    if not rows:
        listed = ", ".join(sorted(index["artifacts"])[:10]) or "none"
        raise FetchError(f"{name}: not published at {where} (its index lists: {listed})")
    if fingerprint is not None:
        matches = [candidate for candidate in rows if candidate.startswith(fingerprint)]
        if len(fingerprint) < SHORTEST_PREFIX or len(matches) != 1:
            found = "none" if not matches else f"{len(matches)}"
            raise FetchError(f"{name}: --fingerprint {fingerprint} names {found} of its {len(rows)} published builds "
                             f"at {where}; give at least {SHORTEST_PREFIX} hex digits of one")
        return matches[0]
    if commit is not None:
        if len(commit) < SHORTEST_PREFIX:
            raise FetchError(f"{name}: --commit {commit}: give at least {SHORTEST_PREFIX} hex digits")
        dated = [(str(row.get("published_at", "")), candidate) for candidate, row in rows.items()
                 if isinstance(row.get("commit"), str) and row["commit"].startswith(commit.lower())]
        if not dated:
            raise FetchError(f"{name}: nothing published at {where} from commit {commit}")
        return max(dated)[1]
    return latest_published(index)[name][0]


def fetch(name: str, source: str, to: str | os.PathLike[str], fingerprint: str | None = None, commit: str | None = None,
          trusted_keys: list[str] | None = None, s3_endpoint: str | None = FROM_SETTINGS, log: Log = print) -> Path:
    """Download the published build of ``name`` at ``source`` into ``to`` and return it;
    :class:`FetchError` (one line, nothing written at ``to``) for anything that does not
    check. ``trusted_keys``: public key paths (default: ``EDGEBUILD_TRUSTED_KEYS``)."""
    if trusted_keys is None:
        from edgebuild.core.config import Settings

        trusted_keys = Settings.from_environ().trusted_key_paths
    target = Path(to).absolute()
    if os.path.islink(target):
        # The rule of edgebuild/core/files.py: nothing is written through a link.
        raise FetchError(f"{target}: {describe_entry(target, os.lstat(target).st_mode)}; fetch creates the directory "
                         "--to names and never writes through a link: give the directory itself, or a new name; "
                         "nothing fetched")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FetchError(f"{target}: exists and is not an empty directory; nothing fetched into it")
    if not target.parent.is_dir():
        raise FetchError(f"{target.parent}: no such directory to fetch into")
    for key in trusted_keys:
        # Readable keys, of one key each, that no one else may rewrite: before any download.
        load_public_key(Path(key))
    location = Location(source, s3_endpoint=s3_endpoint, setting="--from")
    try:
        index = read_index(location)
    except PublishError as error:
        raise FetchError(str(error).removesuffix("; not overwritten")) from None
    chosen = choose(index, name, location.label, fingerprint, commit)
    row = index["artifacts"][name][chosen]
    prefix = f"{name}/{chosen}"
    where = location.where(prefix)
    listed = location.read(f"{prefix}/{CHECKSUMS_FILE}", limit=CHECKSUMS_BYTES)
    if listed is None:
        raise FetchError(f"{where}: no {CHECKSUMS_FILE}; the index lists an entry that is not there")
    if "sha256:" + hashlib.sha256(listed).hexdigest() != row.get("checksum"):
        raise FetchError(f"{where}/{CHECKSUMS_FILE} does not match the checksum the index gives it; nothing fetched")
    try:
        checksums = parse_checksums(listed, f"{where}/{CHECKSUMS_FILE}")
    except PublishError as error:
        raise FetchError(str(error).removesuffix("; not overwritten")) from None
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.fetch~", dir=target.parent))
    try:
        for relative, digest in sorted(checksums.items()):
            path = scratch / relative
            if not location.download(f"{prefix}/{relative}", path):
                raise FetchError(f"{where}: {relative} is listed in {CHECKSUMS_FILE} but missing; nothing fetched")
            if file_sha256(path) != digest:
                raise FetchError(f"{where}: {relative} does not match {CHECKSUMS_FILE}; nothing fetched")
        (scratch / CHECKSUMS_FILE).write_bytes(listed)
        distrust = release_distrust(scratch, trusted_keys) or _verdict_distrust(scratch)
        if distrust is not None:
            raise FetchError(f"{name} {chosen[:12]} at {where} is not taken: {distrust}; nothing fetched")
        if target.is_dir():
            target.rmdir()  # empty, checked above: the rename needs it gone
        os.rename(scratch, target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    log(f"fetched {name} {chosen[:12]} from {where} into {target} ({len(checksums)} files, signature checked)")
    return target


def _verdict_distrust(directory: Path) -> str | None:
    """Why the downloaded entry in ``directory`` is not a verified release: its report did
    not pass, or it was made from a source and does not record that every artifact up its
    chain passed. ``None`` when it is one."""
    try:
        report = read_json(directory / REPORT_JSON, REPORT_BYTES)
        provenance = read_json(directory / PROVENANCE_FILE, RECORD_BYTES)
    except (OSError, UnreadableFile) as error:
        return f"its {REPORT_JSON} or {PROVENANCE_FILE} cannot be read ({error})"
    if not isinstance(report, dict):
        return f"its {REPORT_JSON} is not a report"
    # Signed is not checked: the verdict is re-derived from the checks the release holds.
    problem = verdict_problem(report)
    if problem is not None:
        return f"its {REPORT_JSON}'s verdict does not follow from its checks ({problem})"
    if report.get("passed") is not True:
        return f"its {REPORT_JSON} does not say it passed verification"
    inputs = provenance.get("inputs") if isinstance(provenance, dict) else None
    made_from_sources = isinstance(inputs, dict) and any(role.split(".")[0] == "source" for role in inputs)
    if not made_from_sources:
        return None
    chain = report.get("chain")
    if not isinstance(chain, list) or not chain:
        return ("it is made from a source and its report records no verdict of the artifacts it is made from "
                "(published before edgebuild judged chains); publish it again")
    failed = [str(entry.get("artifact")) for entry in chain if not isinstance(entry, dict) or entry.get("passed") is not True]
    if failed:
        return f"{failed[0]}, which it is made from, had not passed verification when it was judged"
    return None
