"""A project: the manifest, its resolved checkpoints, and the fingerprint of every artifact.

The fingerprint of an artifact is the digest of its *record*: kind, canonical
parameters (cosmetic fields left out), the fingerprints of exactly the inputs
it reads, the digest of the code that builds it and the versions of the tools
involved. The record itself is kept next to the outputs, so that "why is this
stale?" is a diff of two records rather than a guess.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.console import env_flag
from edgebuild.errors import CheckpointError, FilesystemError, ManifestError, ParameterError
from edgebuild.core.fingerprint import StatCache, code_digests, tool_versions
from edgebuild.core.fixtures import ensure_fixture
from edgebuild.core.hashing import digest_json
from edgebuild.core.inputs import expand_inputs
from edgebuild.kinds import get_kind
from edgebuild.core.kind import ArtifactKind, ArtifactParams
from edgebuild.core.manifest import Manifest, load_manifest
from edgebuild.core.record import BuildRecord, CheckpointOrigin
from edgebuild.cache.store import Store

# The builder's verify path: with the kind's verify module, the code a verification
# fingerprint covers.
VERIFICATION_MODULE = "edgebuild.run.verification"
REMOTE_CACHE_ENV = "EDGEBUILD_REMOTE_CACHE"
REMOTE_CACHE_OFF = "off"
# Pull from the remote cache, never push (pull requests: see remote_cache.py).
REMOTE_CACHE_READONLY_ENV = "EDGEBUILD_REMOTE_CACHE_READONLY"


def remote_cache_readonly() -> bool:
    return env_flag(REMOTE_CACHE_READONLY_ENV)


@dataclass(frozen=True)
class Layout:
    """Where a project keeps its outputs and caches."""

    root: Path

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def artifact_dir(self, name: str) -> Path:
        return self.build_dir / name

    @property
    def scratch_dir(self) -> Path:
        """Temporary build directories: on the same filesystem as build/, for atomic renames."""
        return self.build_dir / ".tmp"

    @property
    def store_dir(self) -> Path:
        return self.cache_dir / "store"

    def mutex(self, name: str) -> Path:
        """The file whose advisory lock serialises writers of ``name`` (an artifact, the lock file)."""
        return self.cache_dir / "mutex" / name


class Project:
    """A manifest and where its outputs go: ``build/``, ``cache/`` and the lock file sit
    beside the manifest (``root`` overrides the directory), never in the cwd, so that
    a command run from anywhere finds the same builds."""

    def __init__(self, manifest: Manifest, root: Path | None = None) -> None:
        self.manifest = manifest
        self.layout = Layout(Path(root).absolute() if root is not None else manifest.root)
        self.stat_cache = StatCache(self.layout.cache_dir / "statcache.json")
        self.store = Store(self.layout.store_dir)
        self._checkpoints: dict[str, Checkpoint] = {}
        self._records: dict[str, BuildRecord] = {}
        # numba compiles the F143 kernels on first use (seconds) and caches them beside
        # the module unless told otherwise: under cache/ instead, where CI's cache
        # restore finds them and a non-editable install (a read-only site-packages)
        # still keeps them. Read when numba is first imported, which is later (lazily).
        os.environ.setdefault("NUMBA_CACHE_DIR", str(self.layout.cache_dir / "numba"))

    @classmethod
    def load(cls, manifest_path: str | os.PathLike[str] | None = None, root: Path | None = None) -> "Project":
        return cls(load_manifest(manifest_path), root)

    # --- inputs -----------------------------------------------------------------

    def checkpoint(self, name: str) -> Checkpoint:
        if name not in self._checkpoints:
            spec = self.manifest.checkpoints[name]
            if spec.hf:
                self._checkpoints[name] = self._hub_checkpoint(name, spec.hf, spec.hf_revision)
            else:
                directory = self._checkpoint_directory(name)
                self._checkpoints[name] = Checkpoint(directory, label=f"checkpoint {name!r} ({directory})")
        return self._checkpoints[name]

    def _checkpoint_directory(self, name: str) -> Path:
        """A ``path:`` checkpoint's directory, or the generated fixture's."""
        spec = self.manifest.checkpoints[name]
        where = self.manifest.source.where(("checkpoints", name))
        if spec.uses_fixture:
            try:
                return ensure_fixture(self.layout.cache_dir, spec.fixture, spec.fixture_config)
            except ManifestError as error:
                raise ManifestError(f"{where}: checkpoints -> {name} -> {error}") from None
        directory = Path(spec.path).expanduser()
        if not directory.is_absolute():
            directory = (self.manifest.root / directory).absolute()
        if not directory.is_dir():
            found = "is a file, not a directory" if directory.exists() else "does not exist"
            raise CheckpointError(f"{where}: checkpoints -> {name} -> path: checkpoint directory {directory} {found}")
        return directory

    def _hub_checkpoint(self, name: str, repo_id: str, revision: str) -> Checkpoint:
        """A snapshot of the local Hugging Face cache, its config and weights all there."""
        from edgebuild.core.hub import check_snapshot_files, resolve_snapshot

        where = self._hub_where(name)
        snapshot = resolve_snapshot(repo_id, revision, where)
        checkpoint = Checkpoint(snapshot.directory, label=f"checkpoint {name!r} ({snapshot.description})", origin=snapshot)
        check_snapshot_files(checkpoint, snapshot, where)
        return checkpoint

    def _hub_where(self, name: str) -> str:
        return f"{self.manifest.source.where(('checkpoints', name, 'hf'))}: checkpoints -> {name} -> hf"

    def _hub_origin(self, name: str, checkpoint: Checkpoint, extra_files: tuple[str, ...]) -> CheckpointOrigin:
        """Where a Hugging Face checkpoint's bytes come from, once the files a kind reads
        beyond config and weights (``extra_files``) are known to be in the snapshot."""
        from edgebuild.core.hub import check_snapshot_files

        snapshot = checkpoint.origin
        assert snapshot is not None
        check_snapshot_files(checkpoint, snapshot, self._hub_where(name), extra_files)
        return CheckpointOrigin(
            hf=snapshot.repo_id,
            revision=snapshot.revision,
            commit=snapshot.commit,
            files=snapshot.etags(checkpoint.file_names_read(extra_files)),
        )

    def checkpoints_for(self, params: ArtifactParams) -> dict[str, Checkpoint]:
        """The checkpoints an artifact's build and verification may read: its own and,
        transitively, those of the artifacts it consumes (an ONNX export of a quantized
        encoder is verified against the float encoder its source was made from)."""
        found = {name: self.checkpoint(name) for name in params.checkpoint_names()}
        for source in params.source_artifacts():
            for name, checkpoint in self.checkpoints_for(self.manifest.artifacts[source]).items():
                found.setdefault(name, checkpoint)
        return found

    # --- fingerprints -------------------------------------------------------------

    def kind(self, name: str) -> ArtifactKind:
        return get_kind(self.manifest.artifacts[name].kind)

    def record(self, name: str) -> BuildRecord:
        """The build record of artifact ``name``, before its build (memoised per process)."""
        if name in self._records:
            return self._records[name]
        params = self.manifest.artifacts[name]
        kind = self.kind(name)
        checkpoints = self.checkpoints_for(params)
        own = params.checkpoint_names()
        self._check_parameters(name, checkpoints)
        # Inputs are keyed by the role they play, never by a manifest alias or a path:
        # the same content under another name is the same artifact. What the manifest
        # named is kept beside them (``inputs_named``), for explanations only.
        inputs: dict[str, Any] = {}
        named: dict[str, Any] = {}
        checkpoint_origins: dict[str, CheckpointOrigin] = {}
        # The code's digest parses source files and the tool versions read package
        # metadata (CPU, small files) while the checkpoint's tensors stream from disk:
        # on a cold cache that was 75 ms of a 0.57 s fingerprint of the full-size tower.
        background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgebuild-code-digest")
        code = background.submit(code_digests, kind.build_module)
        versions = background.submit(tool_versions, kind.tool_packages)
        background.shutdown(wait=False)
        try:
            # The artifact's own checkpoints; an artifact with none applies its selection
            # to the checkpoints behind its sources. Either way it covers what this artifact
            # reads: what a source read is covered by the source's fingerprint.
            read_directly = own or [
                alias for alias, checkpoint in checkpoints.items() if kind.tensor_selection(params, checkpoint) is not None
            ]
            for role, checkpoint_name in _roles("checkpoint", read_directly):
                checkpoint = checkpoints[checkpoint_name]
                # Per checkpoint: what a kind reads can depend on how the checkpoint is laid out.
                selection = kind.tensor_selection(params, checkpoint)
                extra_files = selection.files if selection is not None else ()
                if checkpoint.origin is not None:
                    checkpoint_origins[role] = self._hub_origin(checkpoint_name, checkpoint, extra_files)
                inputs[role] = self._checkpoint_fingerprint(checkpoint, selection)
                named[role] = checkpoint.label
            files, files_named = self._input_files(name, verify_only=False)
            inputs |= files
            named |= files_named
            for role, source in _roles("source", params.source_artifacts()):
                inputs[role] = self.fingerprint(source)
                named[role] = source
        except OSError as error:
            raise FilesystemError.of(error, self.manifest.root, f"{name}: cannot read an input") from None
        record = BuildRecord.create(
            kind=params.kind,
            params=params.build_parameters(),
            inputs=inputs,
            code=code.result(),
            versions=versions.result(),
        ).model_copy(update={"inputs_named": named, "checkpoint_origins": checkpoint_origins})
        self._records[name] = record
        return record

    def _display_path(self, path: Path) -> str:
        """An input file as the manifest reaches it, relative to the manifest when inside
        it: normalised (``./`` and ``..`` folded) but not resolved, so a file in a
        symlinked directory is named through the link the manifest uses."""
        spelled, root = Path(os.path.abspath(path)), Path(os.path.abspath(self.manifest.root))
        try:
            return spelled.relative_to(root).as_posix()
        except ValueError:
            return str(spelled)

    def fingerprint(self, name: str) -> str:
        return self.record(name).fingerprint

    def kind_inputs(self, name: str) -> dict[str, Any]:
        """What a kind's build and verify are handed about artifact ``name`` (the
        common part of ``BuildContext`` and ``VerifyContext``)."""
        params = self.manifest.artifacts[name]
        sources = params.source_artifacts()
        return {
            "name": name,
            "params": params,
            "checkpoints": self.checkpoints_for(params),
            "sources": {source: self.layout.artifact_dir(source) for source in sources},
            "source_params": {source: self.manifest.artifacts[source] for source in sources},
            "input_root": self.manifest.root,
        }

    def check(self, name: str) -> None:
        """Everything about artifact ``name`` that can go wrong before its build, without
        hashing anything: its checkpoints open, their config and tensors suit its
        parameters (the kind's ``check_parameters``), every input file exists."""
        params = self.manifest.artifacts[name]
        try:
            checkpoints = self.checkpoints_for(params)
            self._check_parameters(name, checkpoints)
            for checkpoint_name in params.checkpoint_names():
                checkpoint = checkpoints[checkpoint_name]
                selection = self.kind(name).tensor_selection(params, checkpoint)
                if selection is not None and selection.prefixes:
                    checkpoint.select(selection.prefixes)
                for file_name in selection.files if selection is not None else ():
                    checkpoint.file(file_name)
        except CheckpointError as error:
            # Say which artifact needs the checkpoint (a ParameterError says where already).
            key = "checkpoint" if params.checkpoint_names() else "source"
            raise CheckpointError(f"{self.manifest.where(name, key)}: {error}") from None
        for verify_only in (False, True):
            for role, patterns in params.input_patterns(verify_only).items():
                expand_inputs(patterns, self.manifest.root, self.manifest.where(name, *role.split(".")))

    def _check_parameters(self, name: str, checkpoints: dict[str, Checkpoint]) -> None:
        params = self.manifest.artifacts[name]
        kind = self.kind(name)
        try:
            kind.check_parameters(params, checkpoints)
            kind.check_sources(params, {source: self.manifest.artifacts[source] for source in params.source_artifacts()})
        except ParameterError as error:
            keys = [error.key] if error.key else []
            raise ParameterError(f"{self.manifest.where(name, *keys)}: {error}", error.key) from None

    def verify_code(self, name: str) -> dict[str, str]:
        """Digests of the code that judges artifact ``name``."""
        return code_digests(self.kind(name).verify_module, VERIFICATION_MODULE)

    def verify_fingerprint(self, name: str) -> str:
        params = self.manifest.artifacts[name]
        fingerprinted = {"build": self.fingerprint(name), "verify": params.verify_parameters(), "code": self.verify_code(name)}
        files, _ = self._input_files(name, verify_only=True)
        # Only when there are any: every other artifact's verification fingerprint stays as it was.
        if files:
            fingerprinted["files"] = files
        return digest_json(fingerprinted)

    def _input_files(self, name: str, verify_only: bool) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """``files:<role>`` -> the digests of the files the role's patterns name, in order
        (calibration batches are summed in order, so the order is content); and the same
        roles -> the files' paths, for explanations."""
        digests: dict[str, list[str]] = {}
        named: dict[str, list[str]] = {}
        for role, patterns in self.manifest.artifacts[name].input_patterns(verify_only).items():
            paths = expand_inputs(patterns, self.manifest.root, self.manifest.where(name, *role.split(".")))
            digests[f"files:{role}"] = [self.stat_cache.file_digest(path) for path in paths]
            named[f"files:{role}"] = [self._display_path(path) for path in paths]
        return digests, named

    def _checkpoint_fingerprint(self, checkpoint: Checkpoint, selection: Any) -> dict[str, Any]:
        if selection is None:
            return {"config": digest_json(checkpoint.config)}
        entries = checkpoint.select(selection.prefixes) if selection.prefixes else {}
        by_file: dict[Path, list[Any]] = {}
        for entry in entries.values():
            by_file.setdefault(entry.file, []).append(entry)
        tensors: dict[str, Any] = {}
        for path, file_entries in by_file.items():
            digests = self.stat_cache.range_digests(path, [(entry.start, entry.end) for entry in file_entries], label=path.name)
            for entry in file_entries:
                tensors[entry.name] = {
                    "dtype": entry.dtype,
                    "shape": list(entry.shape),
                    "digest": digests[(entry.start, entry.end)],
                }
        config = checkpoint.config_section(selection.config_key) if selection.config_key else checkpoint.config
        fingerprint = {"config": digest_json(config), "config_key": selection.config_key, "tensors": dict(sorted(tensors.items()))}
        if selection.files:
            fingerprint["files"] = {
                name: self.stat_cache.file_digest(checkpoint.file(name)) for name in sorted(selection.files)
            }
        return fingerprint

    # --- sharing --------------------------------------------------------------------

    @property
    def remote_cache_spec(self) -> str | None:
        """Where the remote cache is: ``EDGEBUILD_REMOTE_CACHE`` (``off`` disables
        it), else the manifest's ``remote_cache``; ``None`` when there is none."""
        spec = os.environ.get(REMOTE_CACHE_ENV) or self.manifest.remote_cache
        return None if not spec or spec == REMOTE_CACHE_OFF else spec

    @functools.cached_property
    def remote_cache(self) -> Any:
        """The :class:`~edgebuild.cache.remote.RemoteCache` (read-only under
        ``EDGEBUILD_REMOTE_CACHE_READONLY=1``), or ``None``."""
        spec = self.remote_cache_spec
        if spec is None:
            return None
        from edgebuild.cache.remote import RemoteCache

        # A relative directory in the manifest is relative to the manifest, like every path there.
        base = self.manifest.root if spec == self.manifest.remote_cache else Path.cwd()
        return RemoteCache.open(spec, base, readonly=remote_cache_readonly())

    @property
    def lock_path(self) -> Path:
        """The lock file beside the manifest, named after it: ``artifacts.yaml`` ->
        ``artifacts.lock``, ``ci/release.yml`` -> ``ci/release.lock``."""
        return self.manifest.path.with_suffix(".lock")

    def save_caches(self) -> None:
        self.stat_cache.save()


def _roles(field: str, names: list[str]) -> list[tuple[str, str]]:
    """``[(role, name)]``: ``field`` for one name, ``field.0``, ``field.1``, ... for several."""
    if len(names) == 1:
        return [(field, names[0])]
    return [(f"{field}.{index}", name) for index, name in enumerate(names)]
