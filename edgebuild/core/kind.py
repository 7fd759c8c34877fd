"""What an artifact kind is: a parameter model, the inputs it reads, its outputs,
the module that builds it and the module that verifies it; and the optional hooks
through which it brings everything else that is its own (a starter entry and its
sample inputs for ``init``, tiny checkpoints of its architecture, figures for the
report page).

Nothing outside ``edgebuild/kinds/`` (and a plugin's own package) knows a kind by
name: the engine, the commands and the report page only talk to this interface,
so a new kind is one package plus one line in ``edgebuild/kinds/__init__.py`` (a
built-in) or one entry point of the group ``edgebuild.kinds`` (a plugin).
Kind authors import all of it from :mod:`edgebuild.plugin`.

Why build and verify are modules, not methods: an artifact's fingerprint covers
the code that can change its bytes and nothing else, and its verification
fingerprint the code that judges it. Both are found by following the imports
of ``build_module`` and ``verify_module``, and ``build``/``verify`` below run
exactly those modules, so the code digested is the code that ran.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.console import TERMINAL_SAFE_PATTERN

if TYPE_CHECKING:
    from edgebuild.core.figures import Plots
    from edgebuild.core.report import Check
    from edgebuild.core.runner import Inputs


_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16"}


def _normalise_dtype(value: Any) -> Any:
    return _DTYPE_ALIASES.get(value, value) if isinstance(value, str) else value


# An activation dtype as the manifest writes it: float32 | float16, with fp32 / fp16 accepted.
# The JSON Schema offers what the manifest may say, aliases included.
Dtype = Annotated[
    Literal["float32", "float16"],
    BeforeValidator(
        _normalise_dtype,
        json_schema_input_type=Literal[("float32", "float16", *_DTYPE_ALIASES)],  # type: ignore[valid-type]
    ),
]


class Strict(BaseModel):
    """Base of every manifest model: unknown keys are errors, values are immutable, and
    values are never coerced (``opset: "21"`` is an error, not 21), so that the manifest's
    JSON Schema accepts exactly what the loader does."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _terminal_safe(text: str) -> str:
    from edgebuild.core.console import terminal_unsafe

    problem = terminal_unsafe(text)
    if problem:
        raise ValueError(f"expected text a terminal shows as written, found {problem}")
    return text


# Text that ``doit list`` and messages print: no escapes, bells or bidi overrides.
PrintableText = Annotated[str, AfterValidator(_terminal_safe), Field(json_schema_extra={"pattern": TERMINAL_SAFE_PATTERN})]


class ArtifactParams(Strict):
    """Fields every artifact has. Kinds subclass it with ``kind: Literal[...]``."""

    kind: str
    description: PrintableText = Field(
        default="",
        description="Shown by doit list and the report; never makes an artifact stale.",
    )

    # Fields that never change an artifact's bytes: left out of its build fingerprint.
    # ``verify`` thresholds are part of the verification fingerprint instead.
    COSMETIC_FIELDS: ClassVar[frozenset[str]] = frozenset({"description", "verify"})
    # Fields that name inputs (a checkpoint or source by its alias in the manifest, input
    # files by path or glob): the fingerprint covers what they name, by content, so that
    # a renamed alias, another checkout path or another spelling of a glob is the same
    # artifact. Each ``InputFiles`` field is one too.
    REFERENCE_FIELDS: ClassVar[frozenset[str]] = frozenset({"checkpoint", "source"})
    # ``InputFiles`` fields only verification reads (held-out images of a kind whose build
    # never sees them): in the verification fingerprint, not the build's, so changing one
    # re-verifies and rebuilds nothing.
    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset()

    def build_parameters(self) -> dict[str, Any]:
        """The canonical parameters that determine the built files (what the reference
        fields name is an input of the fingerprint instead)."""
        return self.model_dump(mode="json", exclude=self.COSMETIC_FIELDS | self.REFERENCE_FIELDS | set(self._input_fields()))

    def _input_fields(self) -> dict[str, "InputFiles"]:
        # The instance's dict holds its fields, in their order: no attribute look-up per field.
        return {name: value for name, value in self.__dict__.items() if isinstance(value, InputFiles)}

    def input_patterns(self, verify_only: bool = False) -> dict[str, list[str]]:
        """Input files as written in the manifest, by role (``calibration.images``, ...):
        those the build reads, or (``verify_only``) those only verification reads."""
        return {
            f"{field}.{role}": patterns
            for field, inputs in self._input_fields().items()
            if (field in self.VERIFY_ONLY_INPUTS) == verify_only
            for role, patterns in inputs.roles().items()
        }

    def _optional(self, name: str) -> Any:
        """The field or property ``name``, ``None`` where the kind has neither. Fields are
        read from the instance's dict: pydantic answers a missing attribute by raising
        inside ``__getattr__`` (~13 us), and task generation asks three times an artifact."""
        values = self.__dict__
        if name in values:
            return values[name]
        return getattr(self, name) if _class_has(type(self), name) else None

    def verify_parameters(self) -> dict[str, Any]:
        verify = self._optional("verify")
        return verify.model_dump(mode="json") if verify is not None else {}

    def checkpoint_names(self) -> list[str]:
        """Names of the manifest checkpoints this artifact reads."""
        name = self._optional("checkpoint")
        return [name] if name else []

    def source_artifacts(self) -> list[str]:
        """Names of the artifacts whose outputs this artifact consumes."""
        name = self._optional("source")
        return [name] if name else []

    def implied_source(self) -> dict[str, Any] | None:
        """The manifest values of an artifact this one is made from without naming it (a
        target that describes its model inline implies the export of that model's program),
        or ``None``. The manifest adds it as ``<name>.<kind>`` -- one for every artifact
        that implies the same values -- and makes it this artifact's ``source``."""
        return None


@functools.cache
def _class_has(cls: type, name: str) -> bool:
    """``hasattr(cls, name)``, once per class and name: pydantic's model class answers a
    missing name by raising inside its ``__getattr__``, asked for every artifact."""
    return hasattr(cls, name)


class InputFiles(Strict):
    """A set of input files named in the manifest: every field is a list of paths or
    globs relative to the manifest, one per role (``images``, ``pixel_values``, ...)."""

    def roles(self) -> dict[str, list[str]]:
        return {name: getattr(self, name) for name in type(self).model_fields}

    def is_empty(self) -> bool:
        return not any(self.roles().values())

    def patterns(self) -> list[str]:
        return [pattern for patterns in self.roles().values() for pattern in patterns]


class InputSet(InputFiles):
    """Calibration or held-out inputs: SafeTensors files with a ``pixel_values``
    tensor and/or images (paths or globs, relative to the manifest)."""

    pixel_values: list[str] = Field(
        default_factory=list,
        description="SafeTensors files holding a pixel_values tensor [n, 3, H, W] (paths or globs).",
    )
    images: list[str] = Field(
        default_factory=list,
        description="Images (paths or globs), run through the checkpoint's own image processor.",
    )


@dataclass(frozen=True)
class TensorSelection:
    """The part of a checkpoint a kind reads: tensors by name prefix (``""``: every
    tensor; no prefix: no tensor), one top-level key of ``config.json`` (``None``: all
    of it), and other files of the checkpoint directory by name (read through
    ``Checkpoint.file``). Fingerprints cover exactly this part, by content."""

    prefixes: tuple[str, ...]
    config_key: str | None = None
    files: tuple[str, ...] = ()


P = TypeVar("P", bound=ArtifactParams)


@dataclass
class ArtifactContext(Generic[P]):
    """What a kind is handed: the artifact's parameters, its directory, and its inputs
    (its checkpoints and, transitively, those of its sources; the built directories of
    its source artifacts; the manifest's directory, for relative input paths).

    What a build reads of a source is its directory's files: the artifact's fingerprint
    holds their digests (an artifact made from a source is keyed by the source's bytes,
    not by how they were made).

    :ivar name: The artifact's name in the manifest, for messages only. It is in no
        fingerprint (two artifacts of the same parameters and inputs share one build
        in the store), so a build must not write it into its outputs.
    :ivar params: The artifact's parameters: an instance of the kind's ``Params``, as the
        manifest gave them (matrix entries expanded, defaults filled in).
    :ivar out_dir: Where the outputs are: for ``build``, a fresh scratch directory to write
        them into (renamed into place after ``build`` returned); for ``verify``, the
        built directory, to read only.
    :ivar checkpoints: Each checkpoint the artifact may read, by its manifest alias: its
        own, and transitively those of its sources. Read a checkpoint's tensors
        through ``Checkpoint`` (``select``, ``file``, ``config_section``): what it
        reads of them must be what ``tensor_selection`` declared.
    :ivar sources: Each source artifact's built directory, by the source's name in the
        manifest (the value of ``source:``, or of the parameter that names it): read-only;
        its files' digests are in this artifact's fingerprint.
    :ivar input_root: The manifest's directory: relative input paths in ``params`` are
        relative to it (``expand_inputs`` resolves them).
    :ivar log: Say one line of progress (prefixed with the artifact's name; shown by
        ``doit build`` and ``doit verify``).
    :ivar checkpoint: The one checkpoint of an artifact that names exactly one.
    :ivar source: The built directory of the one source of an artifact made from exactly one.

    Generic over the kind's ``Params``: a build module annotates its context as
    ``BuildContext[MyParams]`` and reads ``context.params`` as ``MyParams``.
    """

    name: str
    params: P
    out_dir: Path
    checkpoints: dict[str, Checkpoint]
    sources: dict[str, Path]
    input_root: Path
    log: Callable[[str], None] = print

    @property
    def checkpoint(self) -> Checkpoint:
        (name,) = self.params.checkpoint_names()
        return self.checkpoints[name]

    @property
    def source(self) -> Path:
        (name,) = self.params.source_artifacts()
        return self.sources[name]


@dataclass
class BuildContext(ArtifactContext[P]):
    """For ``build``: ``out_dir`` is a fresh temporary directory, renamed into place only
    after ``build`` returned.

    :ivar fingerprint: The artifact's fingerprint (hex), for output metadata: a build that
        writes it into an output makes that output a function of the fingerprint.
    """

    fingerprint: str = ""


@dataclass
class VerifyContext(ArtifactContext[P]):
    """For ``verify``: ``out_dir`` is the built directory, read-only.

    :ivar build_info: What ``build`` returned (kept in the build record): timings and any
        facts the build wants the verification to see.
    :ivar source_params: The manifest parameters of each source artifact, by its name: for a
        verification that measures on a source's own input files (they are in this
        artifact's verification fingerprint).
    :ivar held_out: A function giving the nearest held-out inputs along the artifact's
        chain (its own kind's ``evaluation_inputs`` first, then its source's, ...), made on
        the first call; ``None`` where none is declared. What a kind judges itself on
        beside its random inputs (a target against its program on the program's held-out
        images); the files are in the verification fingerprint.
    """

    build_info: dict[str, Any] = field(default_factory=dict)
    source_params: dict[str, ArtifactParams] = field(default_factory=dict)
    held_out: "Callable[[], Inputs | None]" = field(default=lambda: None)


@dataclass
class Verification:
    """What ``verify`` measured: the pass/fail checks, plus numbers kept for the record."""

    checks: list["Check"]
    metrics: dict[str, Any] = field(default_factory=dict)


# A coverage target's name, as the manifest writes it under ``verify: {coverage: ...}``.
TARGET_NAME = re.compile(r"[a-z][a-z0-9_]*")


@dataclass(frozen=True)
class CoverageTarget:
    """A target whose coverage certificate (which nodes of an artifact it takes) can be
    computed here, from the files of a format (``Format.certificates``).

    :ivar name: As the manifest names it (``verify: {coverage: {targets: [NAME], NAME: {...}}}``).
    :ivar summary: The target and who answers for it, one line (the manifest's reference says it).
    :ivar certify: ``"module:function"``: ``function(directory, memo) -> Certificate`` for a
        built directory (``memo``: a dict the certificates of one artifact share, for a
        graph read once); ``LookupError`` when the artifact holds nothing the target can be
        asked about. The module is in the verification fingerprint of every kind whose
        format carries the target.
    :ivar tool_packages: Distributions that compute the certificate when the artifact is
        judged (a new version re-verifies); one that reads what the build recorded names none.
    :ivar vocabulary: What ``never_on_cpu`` names for this target.
    :ivar op_types: ``"module:function"``: ``function() -> Iterable[str]``, every name
        ``never_on_cpu`` may give (the manifest is checked against it when it is loaded: a
        misspelt op type would never match a node, and its gate would always pass);
        ``None``: the names are not checked, and the manifest's reference says so.
    """

    name: str
    summary: str
    certify: str
    tool_packages: tuple[str, ...] = ()
    vocabulary: str = "op types"
    op_types: str | None = None

    def known_op_types(self) -> frozenset[str] | None:
        """The names ``never_on_cpu`` may give (:attr:`op_types`); ``None`` where unchecked."""
        if self.op_types is None:
            return None
        module, _, function = self.op_types.partition(":")
        return frozenset(getattr(importlib.import_module(module), function)())


@dataclass(frozen=True)
class Format:
    """What an artifact is as files that another kind reads: a kind declares the formats it
    ``produces`` and those it ``consumes`` (what its ``source:`` may be), so that kinds name
    formats, never each other. A format carries the coverage certificates its files can
    answer (an ONNX graph: the static tables of what each mobile runtime takes).

    :ivar name: Unique among formats, as messages name it.
    :ivar summary: What it is, in a few words ("an ONNX graph", "a torch.export program").
    :ivar files: The files every artifact of the format holds (beside any others).
    """

    name: str
    summary: str
    files: tuple[str, ...] = ()
    certificates: tuple[CoverageTarget, ...] = ()


@dataclass(frozen=True)
class Process:
    """How the engine runs a kind's steps: where, with what imported first, at what memory.

    :ivar worker_imports: Modules a worker of this kind imports that take seconds
        (``transformers.modeling_utils`` does): the fork server imports them once, when the
        first worker of the kind starts, so every later worker of a run starts with them.
        Nothing else changes: a module that fails to import there is imported (and fails)
        in the worker, as without it.
    :ivar build_imports: Modules the fork server imports, after those, before it forks a
        *build* worker (not a verification): for work a build does once per process and
        keeps, that importing the module does (a delegate's pattern graphs, seconds). The build
        must still do it itself where it is not done (a fresh interpreter).
    :ivar build_warmups: Modules the fork server imports just *after* it forks a build worker:
        for work the first build in a process pays and later ones reuse (torch's ONNX exporter
        warmed up). The worker just forked does not wait for it; the ones forked later start
        with it. Never where workers start as fresh interpreters. What it does must not
        change what a build writes.
    :ivar in_process: Build and verify in the command's own process instead of a worker of
        their own: for steps that load no model (small files read and written), where a
        worker's start (0.2 to 1 s) would be most of the step. A crash in native code then
        ends the command: leave it False for anything that loads a model or runs a converter.
    :ivar memory_factor: Peak memory of its build or verification (the larger) over the
        float32 size of the weights it reads, measured: sizes cluster tasks (``None``: 3,
        a safe guess).
    :ivar quiet_loggers: The loggers (and packages, for their Python warnings) of the
        libraries its steps run that talk about their own internals: kept off the terminal
        in its workers unless ``EDGEBUILD_VERBOSE=1``.
    """

    worker_imports: tuple[str, ...] = ()
    build_imports: tuple[str, ...] = ()
    build_warmups: tuple[str, ...] = ()
    in_process: bool = False
    memory_factor: float | None = None
    quiet_loggers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolEnvironment:
    """A tool that cannot share edgebuild's environment (its pins clash with another
    dependency's), run in a virtual environment of its own beside it: what that
    installs, the module that shows the tool is there, its directory beside edgebuild's
    environment, and the distributions whose versions go into the fingerprints of what
    it makes. ``python -m edgebuild toolenv NAME`` makes it; ``EDGEBUILD_<NAME>_PYTHON``
    names another Python for it.
    """

    name: str
    packages: tuple[str, ...]
    module: str
    directory: str
    versions: tuple[str, ...]

    @property
    def variable(self) -> str:
        """The environment variable that names its Python."""
        return f"EDGEBUILD_{self.name.upper()}_PYTHON"


# The class attributes that ``process`` replaced (read for one release, with a warning).
PROCESS_ATTRIBUTES = ("worker_imports", "build_imports", "build_warmups", "in_process", "memory_factor")


class ArtifactKind(Generic[P]):
    """One kind of artifact. Subclasses set the class variables; the registry
    (``edgebuild/core/registry.py``) checks them when it loads the kind, built-in or plugin.
    Generic over its ``Params``: ``class MyKind(ArtifactKind[MyParams])`` has its hooks
    handed ``MyParams``."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[ArtifactParams]]
    # The files ``build`` must leave in ``out_dir``; anything missing fails the build.
    outputs: ClassVar[tuple[str, ...]]
    # Modules with a ``build(context) -> dict`` and a ``verify(context) -> Verification``.
    build_module: ClassVar[str]
    verify_module: ClassVar[str]
    # What its artifacts are, as files other kinds read (and the coverage certificates
    # those files answer); what a ``source:`` of it must be (any kind producing one of them:
    # checked in the manifest, before anything is built).
    produces: ClassVar[tuple[Format, ...]] = ()
    consumes: ClassVar[tuple[Format, ...]] = ()
    # What making one of its artifacts does to a model, in the words ``doit divergence``
    # names the step of a chain that made an error with: "export" (a model to a graph or
    # program), "quantization", "compilation" (for a device's own compiler), "conversion"
    # (to another runtime's format, the values kept).
    step: ClassVar[str] = "conversion"
    # Deprecated (one release): the kinds a ``source:`` may name, by name. Declare ``consumes``.
    source_kinds: ClassVar[tuple[str, ...]] = ()
    # How the engine runs its steps (imports, in process or in a worker, memory).
    process: ClassVar[Process] = Process()
    # Packages beyond fingerprint.TOOL_PACKAGES whose versions can change this kind's
    # bytes (a compiler only this kind runs): in its fingerprint, and no other kind's.
    tool_packages: ClassVar[tuple[str, ...]] = ()
    # Packages besides edgebuild and the kind's own whose source code the code digests
    # follow (a helper library of the plugin's that changes what it builds).
    code_packages: ClassVar[tuple[str, ...]] = ()
    # Environments of their own that its tools run in: ``python -m edgebuild toolenv NAME``
    # makes one, ``toolenv --needed`` those a manifest's kinds need.
    tool_environments: ClassVar[tuple[ToolEnvironment, ...]] = ()
    # The coverage targets (of its formats' certificates) its verification certifies by
    # default; ``verify: {coverage: {targets: [...]}}`` overrides them per artifact.
    coverage_targets: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        old = {name: cls.__dict__[name] for name in PROCESS_ATTRIBUTES if name in cls.__dict__}
        if old:
            warnings.warn(f"artifact kind {cls.__qualname__}: {', '.join(old)} "
                          f"{'is' if len(old) == 1 else 'are'} deprecated and read for one release only; declare "
                          f"process = Process({', '.join(f'{name}=...' for name in old)})", DeprecationWarning, stacklevel=2)
            cls.process = dataclasses.replace(cls.process, **old)
        if "source_kinds" in cls.__dict__ and cls.__dict__["source_kinds"]:
            warnings.warn(f"artifact kind {cls.__qualname__}: source_kinds is deprecated and read for one release only; "
                          "declare the formats it consumes (consumes = (...))", DeprecationWarning, stacklevel=2)

    def certificates(self) -> dict[str, CoverageTarget]:
        """The coverage targets its artifacts can be certified for, by name: those of the
        formats it produces, in their order."""
        return {target.name: target for form in self.produces for target in form.certificates}

    def takes_source_of(self, kind: "ArtifactKind") -> bool:
        """Whether an artifact of ``kind`` may be this kind's ``source:``."""
        return any(form in self.consumes for form in kind.produces) or kind.name in self.source_kinds

    # --- optional hooks --------------------------------------------------------------
    # The entry ``python -m edgebuild init`` writes for this kind, with what it needs.
    starter: ClassVar["Starter | None"] = None
    # Tiny checkpoints of the kind's architecture that a manifest may name
    # (``fixture: NAME``): generated, so a project runs before it has a real checkpoint.
    fixtures: ClassVar[tuple["Fixture", ...]] = ()
    # The check the report page's summary shows for an artifact of this kind, with its
    # change since the committed build (``None``: the first check named ``cosine`` or
    # ``<something>.cosine``, if any).
    headline_check: ClassVar[str | None] = None
    # True for a kind that only changes its source's file format (the same graph, the same
    # numbers): against the float model of its chain it is held to its source's limits
    # where the source is judged against float (a QDQ graph's, not an fp32 conversion's),
    # unless the manifest sets its own ``vs_float`` (docs/concepts/chains.md).
    exact_conversion: ClassVar[bool] = False
    # Set by the registry: the distribution a plugin kind comes from, and its version
    # (in the kind's fingerprints: upgrading a plugin can change what it builds).
    distribution: ClassVar[tuple[str, str] | None] = None

    def tensor_selection(self, params: P, checkpoint: Checkpoint) -> TensorSelection | None:
        """Which part of ``checkpoint`` the artifact reads itself; ``None`` if it reads none.
        A kind that accepts several checkpoint layouts decides here, from the checkpoint,
        which one it is looking at.

        It applies to the artifact's own ``checkpoint:``. An artifact without one that
        still reads a checkpoint directly (a quantized graph running calibration images
        through the image processor of the checkpoint behind its ``source:``) has it
        applied to the checkpoints reached through its sources: what a source read is
        in the source's fingerprint, what this artifact reads there is in its own."""
        return None

    def consumer_preprocessing(self, params: P) -> dict[str, Any]:
        """What a deployment job must do to an input, beyond the image processor's file and
        the graph's declared inputs, to feed this artifact (``preprocessing`` of the
        ``consumer.json`` every build writes; see ``edgebuild/core/consumer.py``): the image
        size a fixed-shape graph was exported at, settings to override in the processor.
        JSON values, a function of ``params`` alone (the file is a build output). None by default."""
        return {}

    def consumer_programs(self, params: P, out_dir: Path, sources: dict[str, Path]) -> dict[str, dict[str, Any]]:
        """What each program among the built outputs in ``out_dir`` takes and gives, as its
        runtime feeds it (``programs`` of ``consumer.json``; an ONNX graph is described
        there already, under ``graphs``): its path relative to ``out_dir`` -> ``{"inputs":
        [...], "outputs": [...]}``, each ``{"name", "dtype", "shape"}`` in the order the
        runtime takes and gives them (``dtype`` a NumPy dtype name, each dimension a number
        or ``None`` where it is dynamic), with any key the runtime needs besides (a tensor's
        own name in the file). Read from the outputs and the ``sources``' built directories,
        with code the build module imports: every byte must be a function of the
        fingerprint. None by default."""
        return {}

    def write_consumer_contract(self, out_dir: Path, params: P, checkpoints: dict[str, Checkpoint],
                                sources: dict[str, Path]) -> None:
        """Write ``consumer.json`` (and what it ships beside the outputs) into the build's
        scratch directory ``out_dir``, after ``build``: ``edgebuild/core/consumer.py``. Called
        through the kind's interface so that the contract's code is in every kind's build
        digest, as the code of every other output is."""
        from edgebuild.core.consumer import write_consumer_contract

        write_consumer_contract(out_dir, self, params, checkpoints, sources)

    def extra_versions(self) -> dict[str, str]:
        """Versions of tools this kind runs outside edgebuild's environment (a converter in an
        environment of its own): in its fingerprints, like ``tool_packages``'. None by default."""
        return {}

    def code_roots(self, params: P) -> tuple[str, ...]:
        """Modules beyond ``build_module`` that can change this artifact's bytes, chosen by its
        parameters (a model family from another package): its build fingerprint follows
        their imports too. None by default."""
        return ()

    def check_parameters(self, params: P, checkpoints: dict[str, "Checkpoint"]) -> None:
        """Raise :class:`~edgebuild.errors.ParameterError` for parameters this checkpoint
        cannot honour. Called before anything is built or written."""

    def check_deeply(self, params: P, checkpoints: dict[str, "Checkpoint"]) -> None:
        """What ``check --deep`` checks beyond :meth:`check_parameters`, where that takes
        importing the model's code (an input name against its ``forward``): raise
        :class:`~edgebuild.errors.ParameterError` with the key at fault. Never called on the
        way to a build or a status (it may be slow)."""

    def check_sources(self, params: P, sources: dict[str, ArtifactParams]) -> None:
        """Raise :class:`~edgebuild.errors.ParameterError` (with the key at fault) for
        parameters the source artifacts' own parameters rule out (a 16-bit type for a
        graph exported below opset 21). Called before anything is built or written."""

    def build(self, context: BuildContext[P]) -> dict[str, Any]:
        """Write the outputs into ``context.out_dir``; return what the record keeps
        (``timings`` and other build information; none of it goes into a payload file)."""
        return importlib.import_module(self.build_module).build(context)

    def verify(self, context: VerifyContext[P]) -> Verification:
        return importlib.import_module(self.verify_module).verify(context)

    def headline(self, check_names: list[str]) -> str | None:
        """Which of a report's checks (by name, in report order) is this kind's headline."""
        if self.headline_check is not None:
            return self.headline_check if self.headline_check in check_names else None
        return next((name for name in check_names if name == "cosine" or name.endswith(".cosine")), None)

    def report_figures(self, name: str, directory: Path, report: dict[str, Any], uid: str) -> "Plots | None":
        """Figures for the report page (``doit report``) of artifact ``name`` of this kind, drawn
        from its built ``directory`` and its verification ``report``; ``uid`` makes SVG
        ids unique on the page. Cheap: read files, run nothing. ``None``: no figures."""
        return None


@dataclass(frozen=True)
class Starter:
    """One artifact entry on a generated checkpoint, for ``python -m edgebuild init``: its
    YAML (two spaces in under ``artifacts:``, comments welcome), the checkpoints it
    names (manifest name -> the fixture it falls back to) and the sample input files
    its globs match (path relative to the project -> a function returning the bytes)."""

    entry: str
    checkpoints: dict[str, str] = field(default_factory=dict)
    samples: dict[str, Callable[[], bytes]] = field(default_factory=dict)
    # An optional extra the kind needs (``qnn``), and the module that shows it is
    # installed: without it the entry is written commented out, saying what to install,
    # so that ``doit verify`` passes right after ``init`` in any installation.
    extra: str | None = None
    extra_module: str | None = None
    # What to run instead of installing the extra alone, when that is not all it takes, and
    # what says it was done (instead of ``extra_module`` importing).
    install: str | None = None
    ready: Callable[[], bool] | None = None

    def available(self) -> bool:
        import importlib.util

        if self.ready is not None:
            return self.ready()
        return self.extra_module is None or importlib.util.find_spec(self.extra_module) is not None

    def text(self) -> str:
        entry = self.entry.rstrip("\n")
        if self.available():
            return entry
        commented = "\n".join(f"  # {line[2:]}" if line.strip() else line for line in entry.splitlines())
        how = self.install or f"pip install 'edgebuild[{self.extra}]'"
        return f"  # Needs the {self.extra!r} extra: {how}, then uncomment.\n{commented}"


@dataclass(frozen=True)
class Fixture:
    """A tiny checkpoint of a real architecture, generated deterministically: its name (as
    a manifest's ``fixture:`` says it), a line on what it is, its default configuration
    (``fixture_config`` overrides it), and ``write(directory, config, seed)``, which
    writes the checkpoint's files. The bytes depend on the configuration, the seed and
    the code of the module that defines ``write`` (the generated directory is keyed
    by all three)."""

    name: str
    summary: str
    defaults: dict[str, Any]
    write: Callable[[Path, dict[str, Any], int], None]
