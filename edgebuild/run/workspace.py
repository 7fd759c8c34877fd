"""A project at work: its settings, its content-addressed store, its remote cache and
its lock file, beside the manifest.

Everything that builds, verifies, shares or reports takes a :class:`Workspace`: the
doit tasks and commands, the Python API, the cluster driver and the worker
processes. Its settings are its own (not read from the environment behind its
back), so two workspaces with different remote caches can share one process.

It also answers the question early cutoff needs before a source is built here:
"what bytes did the build of this source, at this fingerprint, write?" -- from the
store, from the committed lock file, or from the remote cache's entry. Those
answers only let a downstream fingerprint be computed (for ``doit status``, shards,
a cluster plan); a build always reads its sources from ``build/``, pulled and
checked first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.cache.store import Store
from edgebuild.core.config import Settings, prefer_numba_cache
from edgebuild.core.manifest import Manifest, load_manifest
from edgebuild.core.project import Artifact, BuildGraph
from edgebuild.core.record import RECORD_FILE, REPORT_FILES
from edgebuild.errors import EdgebuildError

if TYPE_CHECKING:
    from edgebuild.cache.remote import RemoteCache

_UNSET: Any = object()


class Workspace(BuildGraph):
    """A :class:`~edgebuild.core.project.BuildGraph` with its settings, store and remote cache."""

    def __init__(self, manifest: Manifest, root: Path | None = None, settings: Settings | None = None) -> None:
        super().__init__(manifest, root, outputs_of=self._outputs_elsewhere)
        self.settings = settings if settings is not None else Settings.from_environ()
        self.store = Store(self.layout.store_dir)
        self._remote: Any = _UNSET
        self._lock: tuple[tuple[int, ...] | None, dict[str, Any]] | None = None
        self._trusted_key_ids: frozenset[str] | None = None
        prefer_numba_cache(self.layout.numba_cache_dir)
        if self.settings.frozen:
            self._freeze_at_head()

    @classmethod
    def open(cls, manifest: str | os.PathLike[str] | None = None, root: Path | None = None,
             settings: Settings | None = None) -> "Workspace":
        """The workspace of ``manifest`` (default: the ``manifest`` setting, else
        ``artifacts.yaml`` in the cwd); outputs beside it unless ``root`` says otherwise."""
        settings = settings if settings is not None else Settings.from_environ()
        return cls(load_manifest(manifest or settings.manifest), root, settings)

    # --- settings -----------------------------------------------------------------------

    def configure(self, **changes: Any) -> Settings:
        """Replace some settings (a command's options); the remote cache is opened again."""
        self.settings = self.settings.replace(**changes)
        if "frozen" in changes:
            self._freeze_at_head() if self.settings.frozen else self.freeze(None)
        if self._remote is not _UNSET and self._remote is not None and set(changes) == {"remote_readonly"}:
            self._remote.readonly = self.settings.remote_readonly
        else:
            self._remote = _UNSET
        self._trusted_key_ids = None
        return self.settings

    @property
    def trusted_key_ids(self) -> frozenset[str]:
        """The ids of the keys whose signatures this runner takes as verification (the
        ``trusted_keys`` setting, and the signing key's own); read once, when first asked."""
        if self._trusted_key_ids is None:
            from edgebuild.cache.signing import Trust

            self._trusted_key_ids = frozenset(Trust.from_settings(self.settings).trusted)
        return self._trusted_key_ids

    def worker_environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment a process started for this workspace gets: ``base`` (default:
        this process's) with these settings, the manifest's path among them."""
        return self.settings.replace(manifest=str(self.manifest.path)).environ(base)

    @property
    def remote_cache_spec(self) -> str | None:
        """Where the remote cache is: the ``remote_cache`` setting (``off`` disables it),
        else the manifest's ``remote_cache``; ``None`` when there is none."""
        if self.settings.remote_cache_disabled:
            return None
        return self.settings.remote_cache or self.manifest.remote_cache or None

    @property
    def remote(self) -> "RemoteCache | None":
        """The remote cache (read-only under the ``remote_readonly`` setting), or ``None``."""
        if self._remote is _UNSET:
            spec = self.remote_cache_spec
            if spec is None:
                self._remote = None
            else:
                from edgebuild.cache.remote import RemoteCache
                from edgebuild.cache.signing import Trust

                from edgebuild.core.config import variable_of

                from_manifest = not self.settings.remote_cache
                # A relative directory in the manifest is relative to the manifest, like every path there.
                base = self.manifest.root if from_manifest else Path.cwd()
                setting = f"{self.manifest.path.name}: remote_cache" if from_manifest else variable_of("remote_cache")
                self._remote = RemoteCache.open(spec, base, readonly=self.settings.remote_readonly,
                                                s3_endpoint=self.settings.s3_endpoint,
                                                trust=Trust.from_settings(self.settings), setting=setting)
        return self._remote

    def _freeze_at_head(self) -> None:
        """Take every fingerprint from the lock file as committed at ``HEAD`` (the
        ``frozen`` setting): what the commit says was built, whatever this checkout wrote since."""
        from edgebuild.core.files import LOCK_BYTES
        from edgebuild.core.lock_format import parse_lock
        from edgebuild.errors import LockfileError
        from edgebuild.run.vcs import committed_bytes

        name = self.lock_path.name
        committed = committed_bytes(self.lock_path, LOCK_BYTES)
        if committed is None:
            raise LockfileError(
                f"{self.lock_path}: not committed at HEAD (or not in a git work tree); --frozen takes every fingerprint "
                f"from the committed lock file: build and verify with the checkpoints, then commit {name}"
            )
        self.freeze(parse_lock(committed, f"{name} at HEAD"), f"{name} at HEAD")

    # --- what a source's build wrote, when it is not in build/ ------------------------------

    def _outputs_elsewhere(self, artifact: Artifact, fingerprint: str) -> dict[str, str] | None:
        record = self.store.record(fingerprint)
        if record is not None:
            return {relative: meta.digest for relative, meta in record.outputs.items()}
        entry = self._locked_entries().get(artifact.name)
        if isinstance(entry, dict) and entry.get("fingerprint") == fingerprint and isinstance(entry.get("outputs"), dict):
            outputs = {relative: meta.get("digest") for relative, meta in entry["outputs"].items() if isinstance(meta, dict)}
            if all(isinstance(digest, str) for digest in outputs.values()):
                return outputs  # type: ignore[return-value]
        if self.remote is not None:
            try:
                remote_entry = self.remote.entry(fingerprint)
            except Exception:  # corrupt or unreachable: a pull will say so; here it is unknown
                return None
            if remote_entry is not None:
                skipped = {RECORD_FILE, *REPORT_FILES}
                return {relative: meta["digest"] for relative, meta in remote_entry["files"].items() if relative not in skipped}
        return None

    def _locked_entries(self) -> dict[str, Any]:
        """The committed lock file's entries (re-read when the file changes; an unreadable
        one counts as empty here: the commands report it)."""
        from edgebuild.core.lock_format import read_lock

        try:
            stat = os.stat(self.lock_path)
            key: tuple[int, ...] | None = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except OSError:
            key = None
        if self._lock is None or self._lock[0] != key:
            try:
                entries = read_lock(self.lock_path) if key is not None else {}
            except EdgebuildError:
                entries = {}
            self._lock = (key, entries)
        return self._lock[1]
