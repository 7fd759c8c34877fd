"""What an artifact kind is: a parameter model, the inputs it reads, its outputs,
the module that builds it and the module that verifies it.

The task layer (``edgebuild/tasks.py``) only talks to this interface, so a new
kind is one package plus one registration line in ``kinds/__init__.py``.

Why build and verify are modules, not methods: an artifact's fingerprint covers
the code that can change its bytes and nothing else, and its verification
fingerprint the code that judges it. Both are found by following the imports
of ``build_module`` and ``verify_module``, and ``build``/``verify`` below run
exactly those modules, so the code digested is the code that ran.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..report import Check


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


class ArtifactParams(Strict):
    """Fields every artifact has. Kinds subclass it with ``kind: Literal[...]``."""

    kind: str
    description: str = ""

    # Fields that never change an artifact's bytes: left out of its build fingerprint.
    # ``verify`` thresholds are part of the verification fingerprint instead.
    COSMETIC_FIELDS: ClassVar[frozenset[str]] = frozenset({"description", "verify"})

    def build_parameters(self) -> dict[str, Any]:
        """The canonical parameters that determine the built files."""
        return self.model_dump(mode="json", exclude=set(self.COSMETIC_FIELDS))

    def verify_parameters(self) -> dict[str, Any]:
        verify = getattr(self, "verify", None)
        return verify.model_dump(mode="json") if verify is not None else {}

    def checkpoint_names(self) -> list[str]:
        """Names of the manifest checkpoints this artifact reads."""
        name = getattr(self, "checkpoint", None)
        return [name] if name else []

    def source_artifacts(self) -> list[str]:
        """Names of the artifacts whose outputs this artifact consumes."""
        name = getattr(self, "source", None)
        return [name] if name else []

    def input_files(self) -> list[str]:
        """Extra input files (calibration data and the like), as written in the manifest."""
        return []


class InputSet(Strict):
    """Calibration or held-out inputs: SafeTensors files with a ``pixel_values``
    tensor and/or images (paths or globs, relative to the manifest)."""

    pixel_values: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.pixel_values and not self.images

    def patterns(self) -> list[str]:
        return [*self.pixel_values, *self.images]


@dataclass(frozen=True)
class TensorSelection:
    """The part of a checkpoint a kind reads: tensors by name prefix, and one
    top-level key of ``config.json``. Fingerprints cover exactly this part."""

    prefixes: tuple[str, ...]
    config_key: str | None = None


@dataclass
class ArtifactContext:
    """What a kind is handed: the artifact's parameters, its directory, and its inputs
    (its checkpoints and, transitively, those of its sources; the built directories
    of its source artifacts; the manifest's directory, for relative input paths)."""

    name: str
    params: ArtifactParams
    out_dir: Path
    checkpoints: dict[str, "Checkpoint"]
    sources: dict[str, Path]
    input_root: Path
    log: Callable[[str], None] = print

    @property
    def checkpoint(self) -> "Checkpoint":
        (name,) = self.params.checkpoint_names()
        return self.checkpoints[name]


@dataclass
class BuildContext(ArtifactContext):
    """For ``build``: ``out_dir`` is a fresh temporary directory, renamed into place only
    after ``build`` returned. ``fingerprint`` is the artifact's (for output metadata)."""

    fingerprint: str = ""


@dataclass
class VerifyContext(ArtifactContext):
    """For ``verify``: ``out_dir`` is the built directory; ``build_info`` is what ``build`` returned."""

    build_info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verification:
    """What ``verify`` measured: the pass/fail checks, plus numbers kept for the record."""

    checks: list["Check"]
    metrics: dict[str, Any] = field(default_factory=dict)


class ArtifactKind:
    """One kind of artifact. Subclasses set the class variables; ``@register`` checks them."""

    name: ClassVar[str]
    summary: ClassVar[str]
    Params: ClassVar[type[ArtifactParams]]
    # The files ``build`` must leave in ``out_dir``; anything missing fails the build.
    outputs: ClassVar[tuple[str, ...]]
    # Modules with a ``build(context) -> dict`` and a ``verify(context) -> Verification``.
    build_module: ClassVar[str]
    verify_module: ClassVar[str]
    # The kinds a ``source:`` may name (checked in the manifest, before anything is built).
    source_kinds: ClassVar[tuple[str, ...]] = ()

    def tensor_selection(self, params: ArtifactParams) -> TensorSelection | None:
        """Which checkpoint tensors the artifact reads; ``None`` if it reads no checkpoint."""
        return None

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, "Checkpoint"]) -> None:
        """Raise :class:`~edgebuild.errors.ParameterError` for parameters this checkpoint
        cannot honour. Called before anything is built or written."""

    def build(self, context: BuildContext) -> dict[str, Any]:
        """Write the outputs into ``context.out_dir``; return what the record keeps
        (``timings`` and other build information; none of it goes into a payload file)."""
        return importlib.import_module(self.build_module).build(context)

    def verify(self, context: VerifyContext) -> Verification:
        return importlib.import_module(self.verify_module).verify(context)
