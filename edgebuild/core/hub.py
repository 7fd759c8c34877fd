"""Checkpoints from the local Hugging Face cache, resolved offline.

A manifest checkpoint ``{hf: org/name, revision: <commit or ref>}`` is a snapshot
of the Hugging Face cache: ``models--org--name/snapshots/<commit>/``, whose files
are links to ``blobs/<etag>``. It is resolved here, offline, by the cache's
documented layout -- a ref such as ``main`` through the file ``refs/<ref>`` -- and
trusted no further than it is checked:

- a ref file is a regular file of at most a few bytes holding a 40-hex commit (a
  trailing newline, as an editor or ``echo`` leaves it, is fine; ``../`` is not);
- the snapshot folder lies inside the repo's folder of the cache (a link out of it
  is refused, not followed);
- a file's etag is recorded only once its bytes were hashed and match it: the sha256
  of a large (LFS) file, the git blob id of a small one. A blob whose bytes no longer
  match its name is an error naming it, with the command that downloads it again.
  The check is remembered in the stat cache, so it costs one read per blob.

Files may be missing from a snapshot (a download limited with ``--include``), so
the files a kind reads are checked by name (``Checkpoint.check_complete``), and
every missing one is named in one error with the command that downloads it.

The fingerprint never sees any of this: it covers the snapshot's content exactly
as it covers a directory given by path. The repo, the commit the revision
resolved to and the files' checked etags go in the build record's
``checkpoint_origins``, the lock file and the provenance, for people tracing an
artifact back.
"""

from __future__ import annotations

import os
import re
import shlex
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgebuild.core.files import SMALL_BYTES, UnreadableFile, open_regular, read_text
from edgebuild.errors import CheckpointError

# huggingface_hub's own CLI (it replaced ``huggingface-cli`` in huggingface_hub 1.0).
DOWNLOAD_COMMAND = ("hf", "download")
COMMIT = re.compile(r"[0-9a-f]{40}")
# ``org/name`` or a bare ``name``, as the Hub spells repo ids: letters, digits, '-',
# '_' and '.', neither '--' nor '..' (the cache folder joins parts with '--').
REPO_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
# A branch, a tag (``v1.0``) or ``refs/pr/N``; read as a file under ``refs/``, so it
# must stay inside it.
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")
DEFAULT_REVISION = "main"


def repo_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is not a Hugging Face model repo id, or ``None`` (the caller says what it found)."""
    if not REPO_ID.fullmatch(repo_id) or "--" in repo_id or ".." in repo_id or repo_id.endswith(".git"):
        return "expected a Hugging Face repo id 'org/name' (letters, digits, '-', '_', '.'; no '--' or '..')"
    return None


def revision_problem(revision: str) -> str | None:
    """Why ``revision`` is neither a commit nor a ref name, or ``None`` (the caller says what it found)."""
    if not REVISION.fullmatch(revision) or ".." in revision or revision.endswith("/"):
        return "expected a 40-hex commit, or a branch or tag name"
    return None


def cache_directory() -> Path:
    """The Hugging Face cache, by huggingface_hub's rules, read now: ``HF_HUB_CACHE``,
    else the older ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
    (huggingface_hub reads them once, at its import, which may predate the caller's
    environment; transformers imports it early.)"""

    def expand(value: str) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(value)))

    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return expand(os.environ[variable])
    if os.environ.get("HF_HOME"):
        return expand(os.environ["HF_HOME"]) / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return expand(base) / "huggingface" / "hub"


@dataclass(frozen=True)
class HubSnapshot:
    """A revision of a Hub repo as the local cache holds it."""

    repo_id: str
    # As the manifest asked (a commit, ``main``, a tag), and the commit it resolved to.
    revision: str
    commit: str
    directory: Path

    @property
    def description(self) -> str:
        """``org/name at main (commit 0123456789ab)``; ``org/name at 0123456789ab`` for a commit."""
        if self.revision == self.commit:
            return f"{self.repo_id} at {self.commit[:12]}"
        return f"{self.repo_id} at {self.revision} (commit {self.commit[:12]})"

    def download_command(self, files: tuple[str, ...] | list[str] = ()) -> str:
        """The command that puts ``files`` (all of the revision when empty) into the cache."""
        return download_command(self.repo_id, self.commit, files)

    def etags(self, names: list[str], digest: "Callable[[Path, str], str] | None" = None) -> dict[str, str | None]:
        """Each file's blob name in the cache (the sha256 of a large file, the git blob id of
        a small one), checked against the file's bytes; ``None`` for a file that is not a
        link into ``blobs/`` (a cache on a filesystem without symlinks keeps copies).
        ``digest(path, algorithm)`` hashes a blob ("sha256" or "git-blob"; default: read it
        now); :class:`CheckpointError` for a blob whose bytes do not match its name."""
        digest = digest or blob_digest
        found: dict[str, str | None] = {}
        for name in names:
            path = self.directory / name
            target = Path(os.readlink(path)) if path.is_symlink() else None
            etag = target.name if target is not None and target.parent.name == "blobs" else None
            if etag is not None:
                algorithm = "sha256" if len(etag) == 64 else "git-blob" if len(etag) == 40 else None
                actual = digest(path.resolve(), algorithm) if algorithm else None
                if actual != etag:
                    shown = f"found {algorithm} {actual}" if actual else "a name that is neither a sha256 nor a git blob id"
                    raise CheckpointError(
                        f"{self.repo_id} at {self.commit[:12]}: {name} links to the blob {etag} in the Hugging Face "
                        f"cache, whose bytes do not match its name ({shown}); delete {path.resolve()} and download it "
                        f"again with: {self.download_command([name])}"
                    )
            found[name] = etag
        return found


def blob_digest(path: Path, algorithm: str) -> str:
    """The name the Hub gives ``path``'s bytes: ``sha256`` (large files, stored with
    LFS) or ``git-blob`` (sha1 of ``blob <size>\\0`` and the bytes: small files)."""
    hasher = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()
    with open_regular(path) as handle:
        if algorithm == "git-blob":
            hasher.update(b"blob %d\0" % os.fstat(handle.fileno()).st_size)
        for block in iter(lambda: handle.read(1 << 22), b""):
            hasher.update(block)
    return hasher.hexdigest()


def download_command(repo_id: str, revision: str, files: tuple[str, ...] | list[str] = ()) -> str:
    return shlex.join([*DOWNLOAD_COMMAND, repo_id, *files, "--revision", revision])


def resolve_snapshot(repo_id: str, revision: str, where: str) -> HubSnapshot:
    """The cached snapshot of ``repo_id`` at ``revision``, offline; one
    :class:`CheckpointError` that names the repo, the revision and the download
    command when the cache does not hold it, or naming the file of the cache that is
    not what it must be. ``where`` prefixes messages."""
    cache = cache_directory()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    missing = CheckpointError(
        f"{where}: {repo_id} at revision {revision} is not in the Hugging Face cache ({cache}); "
        f"download it with: {download_command(repo_id, revision)}"
    )
    if COMMIT.fullmatch(revision):
        commit = revision
    else:
        ref = repo / "refs" / revision
        try:
            text = read_text(ref, SMALL_BYTES)
        except (FileNotFoundError, NotADirectoryError):
            raise missing from None
        except UnreadableFile as error:
            raise CheckpointError(f"{where}: {ref}: {error}; expected a ref file holding a 40-hex commit") from None
        except OSError as error:
            raise CheckpointError(f"{where}: {ref}: cannot read it: {error.strerror or error}") from None
        commit = text.rstrip("\r\n")
        if not COMMIT.fullmatch(commit):
            raise CheckpointError(
                f"{where}: {ref}: expected a 40-hex commit (what the Hub writes there), found {text[:80]!r}"
            )
    folder = repo / "snapshots" / commit
    if not folder.is_dir():
        raise missing
    if not folder.resolve().is_relative_to(repo.resolve()):
        raise CheckpointError(
            f"{where}: {folder} leads to {folder.resolve()}, outside the cache's folder of {repo_id} ({repo}); "
            "expected the snapshot the Hub wrote there"
        )
    return HubSnapshot(repo_id=repo_id, revision=revision, commit=commit, directory=folder)
