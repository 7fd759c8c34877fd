"""Checkpoints from the local Hugging Face cache, resolved offline.

A manifest checkpoint ``{hf: org/name, revision: <commit or ref>}`` is a snapshot
of the Hugging Face cache: ``models--org--name/snapshots/<commit>/``, whose files
are links to ``blobs/<etag>``. ``huggingface_hub.snapshot_download`` with
``local_files_only=True`` resolves it -- a ref such as ``main`` through
``refs/<ref>`` -- without touching a network. It returns the snapshot folder
even when files are missing (a download limited with ``--include``) and does not
check blobs, so the files a kind reads are checked by name
(``Checkpoint.check_complete``), and every missing one is named in one error with
the command that downloads it.

The fingerprint never sees any of this: it covers the snapshot's content exactly
as it covers a directory given by path. The repo, the commit the revision
resolved to and the files' etags go in the build record's
``checkpoint_origins``, the lock file and the provenance, for people tracing an
artifact back.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
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

    def etags(self, names: list[str]) -> dict[str, str | None]:
        """Each file's blob name in the cache (the sha256 of a large file, the git blob id of
        a small one); ``None`` for a file that is not a link into ``blobs/`` (a cache on a
        filesystem without symlinks keeps copies)."""
        found: dict[str, str | None] = {}
        for name in names:
            path = self.directory / name
            target = Path(os.readlink(path)) if path.is_symlink() else None
            found[name] = target.name if target is not None and target.parent.name == "blobs" else None
        return found


def download_command(repo_id: str, revision: str, files: tuple[str, ...] | list[str] = ()) -> str:
    return shlex.join([*DOWNLOAD_COMMAND, repo_id, *files, "--revision", revision])


def resolve_snapshot(repo_id: str, revision: str, where: str) -> HubSnapshot:
    """The cached snapshot of ``repo_id`` at ``revision``, offline; one
    :class:`CheckpointError` that names the repo, the revision and the download
    command when the cache does not hold it. ``where`` prefixes messages."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache = cache_directory()
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{where}: {repo_id} at revision {revision} is not in the Hugging Face cache ({cache}); "
            f"download it with: {download_command(repo_id, revision)}"
        ) from None
    except HFValidationError as error:
        raise CheckpointError(f"{where}: {error}") from None
    commit = folder.name
    if not COMMIT.fullmatch(commit):
        raise CheckpointError(
            f"{where}: {repo_id} at revision {revision} resolved to {folder}, which is not a snapshot "
            f"named by its commit; expected a 40-hex folder name, found {commit!r}"
        )
    return HubSnapshot(repo_id=repo_id, revision=revision, commit=commit, directory=folder)
