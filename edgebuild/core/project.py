"""A manifest's build graph (:class:`BuildGraph`): its artifacts, the sources each is
made from, its resolved checkpoints, and the fingerprint of every artifact. (What a
user opens from Python is ``edgebuild.api.Project``; what the commands work on is
``edgebuild.run.workspace.Workspace``, this with settings, store and remote cache.)

The fingerprint of an artifact is the digest of its *record*: kind, canonical
parameters (cosmetic fields left out), the fingerprints of exactly the inputs
it reads, the digest of the code that builds it and the versions of the tools
involved. The record itself is kept next to the outputs, so that "why is this
stale?" is a diff of two records rather than a guess.

An artifact made from another (its ``source:``) is keyed by the source's *output
bytes* (the digests its build record lists), not by how the source was made: a
source rebuilt to identical bytes -- an unused function added to its build code, a
tool upgrade that changes nothing -- leaves everything downstream up to date
(early cutoff, as Bazel's action keys and Nix's content-addressed derivations
have it). So a downstream fingerprint is known once its sources' records are:
from their build directories here, or from what an ``outputs_of`` resolver finds
(the store, the lock file, the remote cache: ``edgebuild/run/workspace.py``).
Until then it is :class:`SourceNotBuilt`.

An artifact is handled as an :class:`Artifact` (a name bound to its project), never
as a bare string passed around with the project.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.fingerprint import (
    _stat_key, code_digests, kind_code_packages, known_code_and_versions, tool_versions,
)
from edgebuild.core.fixtures import ensure_fixture
from edgebuild.core.hashing import EncodedOnce, canonical_json, digest_json
from edgebuild.core.inputs import expand_inputs
from edgebuild.core.kind import ArtifactKind, ArtifactParams
from edgebuild.core.manifest import Manifest
from edgebuild.core.record import BuildRecord, CheckpointOrigin, config_leaves, read_record_or_none
from edgebuild.core.registry import get_kind
from edgebuild.core.statcache import StatCache
from edgebuild.core.thresholds import coverage_targets, dataset_gate
from edgebuild.errors import CheckpointError, EdgebuildError, FilesystemError, ManifestError, ParameterError

# The builder's verify path: with the kind's verify module, the code a verification
# fingerprint covers (a module name, not an import: the engine that runs it sits above).
VERIFICATION_MODULE = "edgebuild.run.verification"


def verify_roots(kind: ArtifactKind[Any]) -> tuple[str, ...]:
    """The modules whose code (and what they import) judges an artifact of ``kind``: its
    verify module, the engine's verification, and the modules that compute the coverage
    certificates of the formats it produces (each target's own code)."""
    certificates = sorted({target.certify.partition(":")[0] for target in kind.certificates().values()})
    return (kind.verify_module, VERIFICATION_MODULE, *certificates)


# The packages whose versions can change what a chain's float model computes.
FLOAT_MODEL_PACKAGES = ("torch", "transformers")
# ``outputs_of(source, fingerprint)``: the outputs (relative path -> digest) of the build
# of ``source`` at ``fingerprint``, wherever a record of it is known; ``None`` if nowhere.
OutputsResolver = Callable[["Artifact", str], "dict[str, str] | None"]


class SourceNotBuilt(EdgebuildError):
    """An artifact's fingerprint follows from its source's bytes, and no build of the
    source at its current fingerprint is known yet: build the source first."""

    def __init__(self, artifact: str, source: str, fingerprint: str) -> None:
        super().__init__(
            f"{artifact}: its fingerprint follows from the bytes of its source {source}, which is not built at its "
            f"current fingerprint {fingerprint[:12]} (here, in the store, the lock file or the remote cache); "
            f"`doit build {artifact}` builds the source first"
        )
        self.artifact = artifact
        self.source = source


@dataclass(frozen=True)
class Layout:
    """Where a project keeps its outputs and caches."""

    root: Path

    @functools.cached_property
    def build_dir(self) -> Path:
        # Cached: every artifact's directory is made from it (10,000 for a large manifest's
        # `doit list`, each once).
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

    @property
    def numba_cache_dir(self) -> Path:
        return self.cache_dir / "numba"

    def mutex(self, name: str) -> Path:
        """The file whose advisory lock serialises writers of ``name`` (an artifact, the lock file)."""
        return self.cache_dir / "mutex" / name


class Artifact:
    """One artifact of a project: its name bound to everything known about it."""

    __slots__ = ("project", "name")

    def __init__(self, project: "BuildGraph", name: str) -> None:
        self.project = project
        self.name = name

    def __repr__(self) -> str:
        return f"Artifact({self.name!r})"

    def __str__(self) -> str:
        return self.name

    @property
    def params(self) -> ArtifactParams:
        return self.project.manifest.artifacts[self.name]

    @property
    def kind(self) -> ArtifactKind:
        return get_kind(self.params.kind)

    @property
    def directory(self) -> Path:
        """``build/<name>/``: where its outputs, record and report are."""
        return self.project.layout.artifact_dir(self.name)

    @property
    def sources(self) -> list["Artifact"]:
        """The artifacts whose outputs this one consumes."""
        return [self.project.artifact(name) for name in self.params.source_artifacts()]

    @property
    def record(self) -> BuildRecord:
        """Its build record before the build (what it is made from; memoised)."""
        return self.project.record(self)

    @property
    def fingerprint(self) -> str:
        return self.project.fingerprint(self)

    @property
    def verify_fingerprint(self) -> str:
        return self.project.verify_fingerprint(self)

    def where(self, *keys: str) -> str:
        """``file:line:column: artifacts -> name -> key`` for a message about it."""
        return self.project.manifest.where(self.name, *keys)


class BuildGraph:
    """A manifest's artifacts, their sources and fingerprints, and where their outputs go: ``build/``, ``cache/`` and the lock file sit
    beside the manifest (``root`` overrides the directory), never in the cwd, so that
    a command run from anywhere finds the same builds.

    Methods that take an artifact take an :class:`Artifact` (:meth:`artifact` makes one of a name)."""

    def __init__(self, manifest: Manifest, root: Path | None = None, outputs_of: OutputsResolver | None = None) -> None:
        self.manifest = manifest
        self.layout = Layout(Path(root).absolute() if root is not None else manifest.root)
        self.stat_cache = StatCache(self.layout.cache_dir / "statcache.sqlite")
        self.outputs_of = outputs_of
        self._handles = {name: Artifact(self, name) for name in manifest.artifacts}
        self._checkpoints: dict[str, Checkpoint] = {}
        # Per artifact and its sources' output digests: the record's fields and fingerprint,
        # and the record made (validated) from them once something asks for more than the
        # fingerprint.
        self._record_fields: dict[tuple[str, str], dict[str, Any]] = {}
        self._records: dict[tuple[str, str], BuildRecord] = {}
        self._checkpoint_fingerprints: dict[tuple[Path, Any], tuple[tuple[str, ...], tuple[Any, ...], dict[str, Any]]] = {}
        self._config_leaves_memo: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._code_encoded: dict[int, tuple[dict[str, str], EncodedOnce]] = {}
        self._versions_encoded: dict[tuple[Any, ...], EncodedOnce] = {}
        self._checked: set[str] = set()
        self._built_outputs: dict[str, tuple[tuple[int, ...], str, dict[str, str]]] = {}
        self._frozen: tuple[dict[str, Any], str] | None = None

    # --- artifacts ----------------------------------------------------------------

    def artifact(self, name: str) -> Artifact:
        """The handle of artifact ``name`` (``KeyError`` for a name the manifest lacks): where
        a name from the command line or the Python API becomes an :class:`Artifact`."""
        return self._handles[name]

    @property
    def artifacts(self) -> list[Artifact]:
        """Every artifact, in manifest order."""
        return list(self._handles.values())

    def order(self, artifacts: "list[Artifact] | None" = None) -> list[Artifact]:
        """``artifacts`` (default: all) and everything they depend on, dependencies first."""
        selected = None if artifacts is None else [artifact.name for artifact in artifacts]
        return [self._handles[name] for name in self.manifest.order(selected)]

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
        directory = self.path_checkpoint_directory(name)
        if not directory.is_dir():
            found = "is a file, not a directory" if directory.exists() else "does not exist"
            raise CheckpointError(f"{where}: checkpoints -> {name} -> path: checkpoint directory {directory} {found}")
        return directory

    def path_checkpoint_directory(self, name: str) -> Path:
        """Where the ``path:`` checkpoint ``name`` is: relative paths from the manifest's directory."""
        directory = Path(self.manifest.checkpoints[name].path or "").expanduser()
        return directory if directory.is_absolute() else (self.manifest.root / directory).absolute()

    def _hub_checkpoint(self, name: str, repo_id: str, revision: str) -> Checkpoint:
        """A snapshot of the local Hugging Face cache, its config and weights all there."""
        from edgebuild.core.hub import resolve_snapshot

        where = self._hub_where(name)
        snapshot = resolve_snapshot(repo_id, revision, where)
        checkpoint = Checkpoint(snapshot.directory, label=f"checkpoint {name!r} ({snapshot.description})", origin=snapshot)
        checkpoint.check_complete(where)
        return checkpoint

    def _hub_where(self, name: str) -> str:
        return f"{self.manifest.source.where(('checkpoints', name, 'hf'))}: checkpoints -> {name} -> hf"

    def _hub_origin(self, name: str, checkpoint: Checkpoint, extra_files: tuple[str, ...]) -> CheckpointOrigin:
        """Where a Hugging Face checkpoint's bytes come from, once the files a kind reads
        beyond config and weights (``extra_files``) are known to be in the snapshot."""
        snapshot = checkpoint.origin
        assert snapshot is not None
        where = self._hub_where(name)
        checkpoint.check_complete(where, extra_files)
        try:
            # Only what was read, and only once its bytes matched the name it is recorded by.
            files = snapshot.etags(checkpoint.file_names_read(extra_files), digest=self._blob_digest)
        except CheckpointError as error:
            raise CheckpointError(f"{where}: {error}") from None
        return CheckpointOrigin(hf=snapshot.repo_id, revision=snapshot.revision, commit=snapshot.commit, files=files)

    def _blob_digest(self, path: Path, algorithm: str) -> str:
        """A Hub blob's own digest, remembered in the stat cache (one read per blob)."""
        from edgebuild.core.hub import blob_digest

        return self.stat_cache.named_digest(path, algorithm, lambda: blob_digest(path, algorithm))

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

    def record(self, artifact: Artifact) -> BuildRecord:
        """The build record of ``artifact`` before its build (memoised per process, and
        per the bytes of its sources). :class:`SourceNotBuilt` while a source's bytes
        are unknown."""
        if self._frozen is not None:
            return self._frozen_record(artifact)
        memo, fields = self._fields_of(artifact)
        record = self._records.get(memo)
        if record is None:
            record = self._records[memo] = BuildRecord(**fields)
        return record

    def fingerprint(self, artifact: Artifact) -> str:
        """``record(artifact).fingerprint``, without making the record: whether an artifact
        is built, stored or stale asks for its fingerprint only (validating the record's
        fields was a tenth of a 10,000-artifact `doit status`)."""
        if self._frozen is not None:
            return self._frozen_record(artifact).fingerprint
        return self._fields_of(artifact)[1]["fingerprint"]

    def _fields_of(self, artifact: Artifact) -> tuple[tuple[str, str], dict[str, Any]]:
        """The memo key of ``artifact``'s record and the record's fields, its fingerprint
        among them (:meth:`BuildRecord.new_fields`)."""
        params = artifact.params
        kind = artifact.kind
        checkpoints = self.checkpoints_for(params)
        own = params.checkpoint_names()
        # Parameters first: what they rule out is wrong whatever the sources hold.
        if artifact.name not in self._checked:
            self._check_parameters(artifact, checkpoints)
            self._checked.add(artifact.name)
        # Each source by its outputs' digests (early cutoff), looked up afresh: a source
        # may have been rebuilt since (by this process, a worker or another doit).
        source_roles = _roles("source", artifact.sources)
        sources = {role: self._source_key(artifact, source) for role, source in source_roles}
        memo = (artifact.name, canonical_json(sources) if sources else "")
        known = self._record_fields.get(memo)
        if known is not None:
            return memo, known
        # Inputs are keyed by the role they play, never by a manifest alias or a path:
        # the same content under another name is the same artifact. What the manifest
        # named is kept beside them (``inputs_named``), for explanations only.
        inputs: dict[str, Any] = {}
        named: dict[str, Any] = {}
        checkpoint_origins: dict[str, CheckpointOrigin] = {}
        config_values: dict[str, dict[str, Any]] = {}
        # The code's digest parses source files and the tool versions read package
        # metadata (CPU, small files) while the checkpoint's tensors stream from disk:
        # on a cold cache that was 75 ms of a 0.57 s fingerprint of the full-size tower.
        # Once per process: later artifacts take them from memory, without a thread.
        roots = (kind.build_module, *kind.code_roots(params))
        code_packages, version_packages = _code_packages(kind, roots), _version_packages(kind)
        if known_code_and_versions(roots, code_packages, version_packages):
            code: Any = _Done(code_digests(*roots, packages=code_packages))
            versions: Any = _Done(tool_versions(version_packages))
        else:
            background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgebuild-code-digest")
            code = background.submit(code_digests, *roots, packages=code_packages)
            versions = background.submit(tool_versions, version_packages)
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
                section = selection.config_key if selection is not None else None
                config_values[role] = self._config_leaves(checkpoint.config_section(section) if section else checkpoint.config)
            files, files_named = self._input_files(artifact, verify_only=False)
            inputs |= files
            named |= files_named
            inputs |= sources
            named |= {role: source.name for role, source in source_roles}
        except OSError as error:
            raise FilesystemError.of(error, self.manifest.root, f"{artifact.name}: cannot read an input") from None
        fields = self._record_fields[memo] = BuildRecord.new_fields(
            kind=params.kind,
            params=params.build_parameters(),
            inputs=inputs,
            code=self._encoded_code(code.result()),
            versions=self._encoded_versions(version_packages, versions, kind.extra_versions()),
            inputs_named=named, checkpoint_origins=checkpoint_origins, config_values=config_values,
        )
        return memo, fields

    # --- frozen: fingerprints from the committed lock file ------------------------------

    def freeze(self, entries: dict[str, Any] | None, shown: str = "") -> None:
        """Take every build record from ``entries`` (the lock file's, as committed; named
        ``shown`` in messages) instead of the checkpoints, which are then never read
        (``edgebuild/core/frozen.py``); ``None``: compute them again."""
        self._frozen = (entries, shown) if entries is not None else None
        self._records.clear()
        self._record_fields.clear()

    @property
    def frozen(self) -> bool:
        return self._frozen is not None

    def _frozen_record(self, artifact: Artifact) -> BuildRecord:
        from edgebuild.core.frozen import frozen_record

        assert self._frozen is not None
        memo = (artifact.name, "frozen")
        if memo not in self._records:
            entries, shown = self._frozen
            kind = artifact.kind
            roots = (kind.build_module, *kind.code_roots(artifact.params))
            code = code_digests(*roots, packages=_code_packages(kind, roots))
            self._records[memo] = frozen_record(artifact, _roles("source", artifact.sources), entries, shown, code,
                                                tool_versions(_version_packages(kind)) | kind.extra_versions())
        return self._records[memo]

    def _source_key(self, artifact: Artifact, source: Artifact) -> dict[str, Any]:
        """What ``artifact``'s fingerprint holds of ``source``: the digests of the files its
        current build wrote."""
        fingerprint = self.fingerprint(source)
        outputs = self.built_outputs(source, fingerprint)
        if outputs is None and self.outputs_of is not None:
            outputs = self.outputs_of(source, fingerprint)
        if outputs is None:
            raise SourceNotBuilt(artifact.name, source.name, fingerprint)
        return {"outputs": dict(sorted(outputs.items()))}

    def built_outputs(self, artifact: Artifact, fingerprint: str) -> dict[str, str] | None:
        """The outputs ``build/<name>/.edgebuild.json`` lists, if it is the build of
        ``fingerprint`` (re-read only when the record file changed)."""
        from edgebuild.core.record import RECORD_FILE

        path = artifact.directory / RECORD_FILE
        try:
            stat = os.stat(path)
        except OSError:
            return None
        key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        cached = self._built_outputs.get(artifact.name)
        if cached is None or cached[0] != key:
            record = read_record_or_none(artifact.directory)
            if record is None:
                return None
            cached = (key, record.fingerprint, {relative: meta.digest for relative, meta in record.outputs.items()})
            self._built_outputs[artifact.name] = cached
        return dict(cached[2]) if cached[1] == fingerprint else None

    def _display_path(self, path: Path) -> str:
        """An input file as the manifest reaches it, relative to the manifest when inside
        it: normalised (``./`` and ``..`` folded) but not resolved, so a file in a
        symlinked directory is named through the link the manifest uses."""
        spelled, root = Path(os.path.abspath(path)), Path(os.path.abspath(self.manifest.root))
        try:
            return spelled.relative_to(root).as_posix()
        except ValueError:
            return str(spelled)

    def kind_inputs(self, artifact: Artifact) -> dict[str, Any]:
        """What a kind's build and verify are handed about ``artifact`` (the common part of
        ``BuildContext`` and ``VerifyContext``)."""
        return {
            "name": artifact.name,
            "params": artifact.params,
            "checkpoints": self.checkpoints_for(artifact.params),
            "sources": {source.name: source.directory for source in artifact.sources},
            "input_root": self.manifest.root,
        }

    def check(self, artifact: Artifact) -> None:
        """Everything about ``artifact`` that can go wrong before its build: its
        checkpoints open, their config and tensors suit its parameters (the kind's
        ``check_parameters``), every input file exists, and each Hugging Face blob it reads
        holds the bytes its name says (hashed, as the build's fingerprint would: the same
        error). Nothing else is hashed."""
        params = artifact.params
        try:
            checkpoints = self.checkpoints_for(params)
            self._check_parameters(artifact, checkpoints)
            self._check_parameters(artifact, checkpoints, deeply=True)
            for checkpoint_name in params.checkpoint_names():
                checkpoint = checkpoints[checkpoint_name]
                selection = artifact.kind.tensor_selection(params, checkpoint)
                if selection is not None and selection.prefixes:
                    checkpoint.select(selection.prefixes)
                for file_name in selection.files if selection is not None else ():
                    checkpoint.file(file_name)
        except CheckpointError as error:
            # Say which artifact needs the checkpoint (a ParameterError says where already).
            key = "checkpoint" if params.checkpoint_names() else "source"
            raise CheckpointError(f"{artifact.where(key)}: {error}") from None
        for checkpoint_name in params.checkpoint_names():
            checkpoint = checkpoints[checkpoint_name]
            if checkpoint.origin is not None:
                # What the build refuses, refused here too, in the build's words: a blob of the
                # Hugging Face cache whose bytes are not what its name says.
                selection = artifact.kind.tensor_selection(params, checkpoint)
                self._hub_origin(checkpoint_name, checkpoint, selection.files if selection is not None else ())
        for verify_only in (False, True):
            for role, patterns in params.input_patterns(verify_only).items():
                expand_inputs(patterns, self.manifest.root, artifact.where(*role.split(".")))

    def _check_parameters(self, artifact: Artifact, checkpoints: dict[str, Checkpoint], deeply: bool = False) -> None:
        params = artifact.params
        try:
            if deeply:
                artifact.kind.check_deeply(params, checkpoints)
                return
            artifact.kind.check_parameters(params, checkpoints)
            artifact.kind.check_sources(params, {source.name: source.params for source in artifact.sources})
        except ParameterError as error:
            keys = [error.key] if error.key else []
            raise ParameterError(f"{artifact.where(*keys)}: {error}", error.key) from None

    def verify_code(self, artifact: Artifact) -> dict[str, str]:
        """Digests of the code that judges ``artifact``."""
        kind = artifact.kind
        return code_digests(*verify_roots(kind), packages=kind_code_packages(kind))

    def verify_fingerprint(self, artifact: Artifact) -> str:
        """The digest of what a verdict on ``artifact`` depends on (:meth:`verify_identity`)."""
        return digest_json(self.verify_identity(artifact))

    def verify_identity(self, artifact: Artifact) -> dict[str, Any]:
        """What a verdict on ``artifact`` depends on, by part: its build, its thresholds, the
        judging code, the files only verification reads and the input files of its sources
        (a verification may measure on its source's held-out images) and, along its chain
        (``edgebuild/run/chain.py``), the judging code of every artifact it is made from,
        the input files of those further up, and the float model at the root; and the
        dataset of a dataset gate, by content. ``doit diff`` names a changed part."""
        identity: dict[str, Any] = {
            "build": self.fingerprint(artifact),
            "verify": artifact.params.verify_parameters(),
            "code": self.verify_code(artifact),
        }
        files, _ = self._input_files(artifact, verify_only=True)
        for role, source in _roles("source", artifact.sources):
            for verify_only in (False, True):
                source_files, _ = self._input_files(source, verify_only)
                files |= {f"{role}:{key}": digests for key, digests in source_files.items()}
        # Only when there are any: every other artifact's verification fingerprint stays as it was.
        if files:
            identity["files"] = files
        chain = self.lineage(artifact)
        if len(chain) > 1:
            # The chain's judgement runs the root's float model on inputs an ancestor's kind
            # may give (held-out images two steps up): their code, files and model count.
            identity["ancestors_code"] = {ancestor.name: self._kind_verify_code(ancestor) for ancestor in chain[1:]}
            further: dict[str, Any] = {}
            for depth, ancestor in enumerate(chain[2:], start=2):
                for verify_only in (False, True):
                    further |= {f"ancestor.{depth}:{key}": digests
                                for key, digests in self._input_files(ancestor, verify_only)[0].items()}
            if further:
                identity["ancestors_files"] = further
        gate = dataset_gate(artifact.params)
        if len(chain) > 1 or gate is not None:
            identity["float"] = self.float_identity(chain[-1])
        if gate is not None:
            identity["dataset"] = self.dataset_identity(artifact, gate)
        tools = self.coverage_tools(artifact)
        if tools:
            identity["coverage_tools"] = tools
        return identity

    def coverage_tools(self, artifact: Artifact) -> dict[str, str]:
        """``target -> "package version"`` of each package that computes one of the
        artifact's coverage certificates when it is judged: a new version recomputes the
        certificate (a verification), and rebuilds nothing unless the build uses it too."""
        known = artifact.kind.certificates()
        wanted = {target: known[target].tool_packages for target in coverage_targets(artifact.kind, artifact.params)
                  if target in known and known[target].tool_packages}
        versions = tool_versions(tuple(sorted({package for packages in wanted.values() for package in packages})))
        return {target: ", ".join(f"{package} {versions[package]}" for package in packages)
                for target, packages in wanted.items()}

    def verify_parts(self, artifact: Artifact) -> dict[str, str]:
        """A digest of each part of :meth:`verify_identity` but the build and the thresholds:
        what a report and a lock entry keep, so that "why is it judged again" names the
        part that moved."""
        return {part: digest_json(value) for part, value in self.verify_identity(artifact).items()
                if part not in ("build", "verify")}

    def lineage(self, artifact: Artifact) -> list[Artifact]:
        """``artifact``, its source, the source's source, ...: the chain it is made along, up
        to its root (an artifact made from no source, or from several)."""
        chain = [artifact]
        while len(sources := chain[-1].sources) == 1:
            chain.append(sources[0])
        return chain

    def _kind_verify_code(self, artifact: Artifact) -> dict[str, str]:
        """The code of ``artifact``'s kind's verify module alone (its chain hooks: the float
        model, the inputs it gives), without the engine's."""
        kind = artifact.kind
        return code_digests(kind.verify_module, packages=kind_code_packages(kind))

    def float_identity(self, root: Artifact) -> dict[str, Any]:
        """What the float model of a chain rooted at ``root`` computes from, by content: the
        part of its checkpoints the root reads, its parameters, the code of the root kind's
        verify module (its ``float_model``), the torch and transformers versions. Not the
        root's export code nor onnxruntime's version: an upgrade of those keeps the float
        model's outputs (``cache/references``)."""
        record = self.record(root)
        versions = tool_versions(_version_packages(root.kind))
        return {
            "kind": record.kind,
            "params": record.params,
            "inputs": record.inputs,
            "code": self._kind_verify_code(root),
            "versions": {package: versions.get(package) for package in FLOAT_MODEL_PACKAGES},
        }

    def dataset_identity(self, artifact: Artifact, gate: Any) -> dict[str, Any]:
        """A dataset gate's set, by content (``edgebuild/core/datasets.py``)."""
        from edgebuild.core.datasets import dataset_files, dataset_identity

        files = dataset_files(gate, self.manifest.root, artifact.where("verify", "dataset"))
        return dataset_identity(gate, files, self.stat_cache.file_digest)

    def input_paths(self, artifact: Artifact) -> list[Path]:
        """Every input file ``artifact`` and its sources read (build and verification, a
        dataset gate's own files included), as the manifest reaches them: what a commit
        must hold to say what produced it."""
        paths: list[Path] = []
        for each in self.order([artifact]):
            for verify_only in (False, True):
                for role, patterns in each.params.input_patterns(verify_only).items():
                    paths += expand_inputs(patterns, self.manifest.root, each.where(*role.split(".")))
            gate = dataset_gate(each.params)
            if gate is not None and gate.patterns():
                from edgebuild.core.datasets import dataset_files

                paths += dataset_files(gate, self.manifest.root, each.where("verify", "dataset"))
        return list(dict.fromkeys(paths))

    def _input_files(self, artifact: Artifact, verify_only: bool) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """``files:<role>`` -> the digests of the files the role's patterns name, in order
        (calibration batches are summed in order, so the order is content); and the same
        roles -> the files' paths, for explanations."""
        digests: dict[str, list[str]] = {}
        named: dict[str, list[str]] = {}
        for role, patterns in artifact.params.input_patterns(verify_only).items():
            paths = expand_inputs(patterns, self.manifest.root, artifact.where(*role.split(".")))
            digests[f"files:{role}"] = [self.stat_cache.file_digest(path) for path in paths]
            named[f"files:{role}"] = [self._display_path(path) for path in paths]
        return digests, named

    def _config_leaves(self, config: dict[str, Any]) -> dict[str, Any]:
        """``config_leaves`` of a checkpoint's config (section), once per config object: the
        artifacts of a matrix hold the same one. The object is kept with its leaves, so its
        ``id`` is not reused while it is."""
        memo = self._config_leaves_memo.get(id(config))
        if memo is None or memo[0] is not config:
            memo = self._config_leaves_memo[id(config)] = (config, config_leaves(config))
        return memo[1]

    def _encoded_code(self, code: dict[str, str]) -> EncodedOnce:
        """The code digests, encoded once per dict: ``code_digests`` hands every artifact
        of a kind the same one (kept here with its encoding, so its ``id`` is not reused)."""
        memo = self._code_encoded.get(id(code))
        if memo is None or memo[0] is not code:
            memo = self._code_encoded[id(code)] = (code, EncodedOnce(code))
        return memo[1]

    def _encoded_versions(self, packages: tuple[str, ...], versions: Any, extra: dict[str, str]) -> EncodedOnce:
        """The tool versions, encoded once per packages and kind's extra versions: read once
        per process (``tool_versions``), so the same for every artifact that names them."""
        key = (packages, tuple(sorted(extra.items())))
        encoded = self._versions_encoded.get(key)
        if encoded is None:
            encoded = self._versions_encoded[key] = EncodedOnce(versions.result() | extra)
        return encoded

    def _checkpoint_fingerprint(self, checkpoint: Checkpoint, selection: Any) -> dict[str, Any]:
        """What a build reads of ``checkpoint`` (``selection``), by content. Memoised per
        checkpoint and selection while the stat of every file it covers is unchanged: the
        artifacts of a matrix read the same part of one checkpoint."""
        if selection is None:
            return {"config": digest_json(checkpoint.config)}

        def parts() -> tuple[dict[Path, list[Any]], dict[str, Path]]:
            entries = checkpoint.select(selection.prefixes) if selection.prefixes else {}
            grouped: dict[Path, list[Any]] = {}
            for entry in entries.values():
                grouped.setdefault(entry.file, []).append(entry)
            return grouped, {name: checkpoint.file(name) for name in sorted(selection.files)}

        # Every artifact of a matrix after the first: one stat per file, nothing else.
        key = (checkpoint.directory, selection)
        memo = self._checkpoint_fingerprints.get(key)
        if memo is not None:
            paths, stats, fingerprint = memo
            if _stat_keys(paths) == stats:
                return fingerprint
        # Which tensors of which files, and which named files: from the checkpoint's index,
        # read once per process; the same for every artifact of a matrix.
        by_file, named_files = checkpoint.once(("fingerprint parts", selection), parts)
        paths = tuple(os.fspath(path) for path in (*by_file, *named_files.values()))
        before = _stat_keys(paths)
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
        parts = {"config": digest_json(config), "config_key": selection.config_key, "tensors": dict(sorted(tensors.items()))}
        if selection.files:
            parts["files"] = {name: self.stat_cache.file_digest(path) for name, path in named_files.items()}
        # Held by every artifact that reads this part of the checkpoint: encoded once.
        fingerprint = EncodedOnce(parts)
        # Only what no write touched while it was read is remembered.
        if _stat_keys(paths) == before:
            self._checkpoint_fingerprints[key] = (paths, before, fingerprint)
        return fingerprint

    # --- files beside the manifest ------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        """The lock file beside the manifest, named after it: ``artifacts.yaml`` ->
        ``artifacts.lock``, ``ci/release.yml`` -> ``ci/release.lock``."""
        return self.manifest.path.with_suffix(".lock")

    def save_caches(self) -> None:
        self.stat_cache.save()


def _stat_keys(paths: tuple[str, ...]) -> tuple[Any, ...]:
    """Each path's stat as the stat cache keys it (``None`` for a path that is gone)."""
    keys = []
    for path in paths:
        try:
            keys.append(tuple(_stat_key(os.stat(path))))
        except OSError:
            keys.append(None)
    return tuple(keys)


@dataclass(frozen=True)
class _Done:
    """A value already computed, read as a future's result is."""

    value: Any

    def result(self) -> Any:
        return self.value


def _roles(field: str, items: list[Any]) -> list[tuple[str, Any]]:
    """``[(role, item)]``: ``field`` for one item, ``field.0``, ``field.1``, ... for several."""
    if len(items) == 1:
        return [(field, items[0])]
    return [(f"{field}.{index}", item) for index, item in enumerate(items)]


@functools.cache
def _code_packages(kind: ArtifactKind, roots: tuple[str, ...]) -> tuple[str, ...]:
    """The packages a kind's build digest follows: its own, and those of its extra code roots
    (once per kind and roots: every artifact asks)."""
    return tuple(sorted({*kind_code_packages(kind), *(root.split(".")[0] for root in roots)}))


def _version_packages(kind: ArtifactKind) -> tuple[str, ...]:
    """The packages whose versions are in the kind's fingerprints beyond the common tools:
    its own tool packages and, for a plugin, the distribution it comes from."""
    distribution = (kind.distribution[0],) if kind.distribution is not None and kind.distribution[0] != "this process" else ()
    return (*kind.tool_packages, *distribution)
