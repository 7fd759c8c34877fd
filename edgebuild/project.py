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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import Checkpoint
from .errors import CheckpointError, ManifestError, ParameterError
from .fingerprint import StatCache, code_digests, tool_versions
from .fixtures import ensure_fixture
from .hashing import digest_json
from .inputs import expand_inputs
from .kinds import get_kind
from .kinds.base import ArtifactKind, ArtifactParams
from .manifest import Manifest, load_manifest
from .record import BuildRecord
from .store import Store

# The builder's verify path: with the kind's verify module, the code a verification
# fingerprint covers.
VERIFICATION_MODULE = "edgebuild.verification"
REMOTE_CACHE_ENV = "EDGEBUILD_REMOTE_CACHE"
REMOTE_CACHE_OFF = "off"


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

    @classmethod
    def load(cls, manifest_path: str | os.PathLike[str] | None = None, root: Path | None = None) -> "Project":
        return cls(load_manifest(manifest_path), root)

    # --- inputs -----------------------------------------------------------------

    def checkpoint(self, name: str) -> Checkpoint:
        if name not in self._checkpoints:
            spec = self.manifest.checkpoints[name]
            where = self.manifest.source.where(("checkpoints", name))
            if spec.uses_fixture:
                try:
                    directory = ensure_fixture(self.layout.cache_dir, spec.fixture, spec.fixture_config)
                except ManifestError as error:
                    raise ManifestError(f"{where}: checkpoints -> {name} -> fixture: {error}") from None
            else:
                directory = Path(spec.path).expanduser()
                if not directory.is_absolute():
                    directory = self.manifest.root / directory
                if not directory.is_dir():
                    raise CheckpointError(
                        f"{where}: checkpoints -> {name} -> path: checkpoint directory {directory} does not exist"
                    )
            self._checkpoints[name] = Checkpoint(directory, label=f"checkpoint {name!r} ({directory})")
        return self._checkpoints[name]

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
        inputs: dict[str, Any] = {}
        selection = kind.tensor_selection(params)
        # Only the artifact's own checkpoints: a source's are covered by its fingerprint.
        for checkpoint_name in own:
            checkpoint = checkpoints[checkpoint_name]
            inputs[f"checkpoint:{checkpoint_name}"] = self._checkpoint_fingerprint(checkpoint, selection)
        paths = expand_inputs(params.input_files(), self.manifest.root, self.manifest.where(name))
        for path in paths:
            try:
                key = path.resolve().relative_to(self.manifest.root.resolve()).as_posix()
            except ValueError:
                key = str(path)
            inputs[f"file:{key}"] = self.stat_cache.file_digest(path)
        for source in params.source_artifacts():
            inputs[f"artifact:{source}"] = self.fingerprint(source)
        record = BuildRecord.create(
            kind=params.kind,
            params=params.build_parameters(),
            inputs=inputs,
            code=code_digests(kind.build_module),
            versions=tool_versions(),
        )
        self._records[name] = record
        return record

    def fingerprint(self, name: str) -> str:
        return self.record(name).fingerprint

    def check(self, name: str) -> None:
        """Everything about artifact ``name`` that can go wrong before its build, without
        hashing anything: its checkpoints open, their config and tensors suit its
        parameters (the kind's ``check_parameters``), every input file exists."""
        params = self.manifest.artifacts[name]
        try:
            checkpoints = self.checkpoints_for(params)
            self._check_parameters(name, checkpoints)
            selection = self.kind(name).tensor_selection(params)
            for checkpoint_name in params.checkpoint_names():
                if selection is not None:
                    checkpoints[checkpoint_name].select(selection.prefixes)
        except CheckpointError as error:
            # Say which artifact needs the checkpoint (a ParameterError says where already).
            key = "checkpoint" if params.checkpoint_names() else "source"
            raise CheckpointError(f"{self.manifest.where(name, key)}: {error}") from None
        expand_inputs(params.input_files(), self.manifest.root, self.manifest.where(name))

    def _check_parameters(self, name: str, checkpoints: dict[str, Checkpoint]) -> None:
        params = self.manifest.artifacts[name]
        try:
            self.kind(name).check_parameters(params, checkpoints)
        except ParameterError as error:
            keys = [error.key] if error.key else []
            raise ParameterError(f"{self.manifest.where(name, *keys)}: {error}", error.key) from None

    def verify_code(self, name: str) -> dict[str, str]:
        """Digests of the code that judges artifact ``name``."""
        return code_digests(self.kind(name).verify_module, VERIFICATION_MODULE)

    def verify_fingerprint(self, name: str) -> str:
        params = self.manifest.artifacts[name]
        return digest_json(
            {"build": self.fingerprint(name), "verify": params.verify_parameters(), "code": self.verify_code(name)}
        )

    def _checkpoint_fingerprint(self, checkpoint: Checkpoint, selection: Any) -> dict[str, Any]:
        if selection is None:
            return {"config": digest_json(checkpoint.config)}
        entries = checkpoint.select(selection.prefixes)
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
        return {"config": digest_json(config), "config_key": selection.config_key, "tensors": dict(sorted(tensors.items()))}

    # --- sharing --------------------------------------------------------------------

    @property
    def remote_cache_spec(self) -> str | None:
        """Where the remote cache is: ``EDGEBUILD_REMOTE_CACHE`` (``off`` disables
        it), else the manifest's ``remote_cache``; ``None`` when there is none."""
        spec = os.environ.get(REMOTE_CACHE_ENV) or self.manifest.remote_cache
        return None if not spec or spec == REMOTE_CACHE_OFF else spec

    @functools.cached_property
    def remote_cache(self) -> Any:
        """The :class:`~edgebuild.remote_cache.RemoteCache`, or ``None``."""
        spec = self.remote_cache_spec
        if spec is None:
            return None
        from .remote_cache import RemoteCache

        # A relative directory in the manifest is relative to the manifest, like every path there.
        base = self.manifest.root if spec == self.manifest.remote_cache else Path.cwd()
        return RemoteCache.open(spec, base)

    @property
    def lock_path(self) -> Path:
        """The lock file beside the manifest, named after it: ``artifacts.yaml`` ->
        ``artifacts.lock``, ``ci/release.yml`` -> ``ci/release.lock``."""
        return self.manifest.path.with_suffix(".lock")

    def save_caches(self) -> None:
        self.stat_cache.save()
