"""What every target kind shares: its parameters (a ``torch_export`` source, or the model
described inline, which implies one), the program it lowers and the inputs it is checked
on (every size of the program's dynamic axes); its judgement is ``judging.py``. A target knows its lowering and its runtime, nothing of the
model (``families.py`` does).

Levels: ``ran`` (executed here, in the target's own runtime, and compared), ``loaded``
(parsed or loaded by its runtime, not executed: a Core ML program on Linux), ``none``.
``verify: {require_level: ran}`` (the default) fails an artifact that did not get there.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from edgebuild.plugin import ArtifactParams, Inputs, ParameterError, PerOutputLimits, VerifySettings

from .params import INFO_FILE, MODEL_FIELDS, PROGRAM_FILE, ModelFields

Level = Literal["ran", "loaded", "none"]
LEVELS: tuple[Level, ...] = ("none", "loaded", "ran")
SOURCE_KIND = "torch_export"


class TargetVerify(VerifySettings, PerOutputLimits):
    """The target's outputs against the program it was lowered from (and, by the engine,
    against the float model: ``vs_float``); unset limits take the target's defaults."""

    require_level: Level = Field(
        default="ran",
        description="How far the check must get here: ran (executed in the target's runtime and compared), "
                    "loaded, or none.",
    )
    samples: int = Field(default=2, ge=1, le=64, description="Seeded random inputs per size of the dynamic axes.")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class TargetModel(ModelFields):
    """The model fields, each optional: a target names its ``source`` or describes its model."""

    checkpoint: str | None = Field(  # type: ignore[assignment]
        default=None, description="The checkpoint (with model_class, when no source is named).",
    )
    model_class: str | None = Field(  # type: ignore[assignment]
        default=None,
        description="A transformers class (or Qwen3_5VisionModel): the model, when no source is named; it implies "
                    "the torch_export artifact <name>.torch_export, shared by every target of the same model.",
    )


class TargetParams(TargetModel, ArtifactParams):
    """A target: the program to lower (``source``, or the model inline) and its verification."""

    source: str | None = Field(
        default=None, description="The torch_export artifact to lower (implied when the model is described inline).",
    )

    # The model fields describe the source (the program), not this artifact's bytes: a
    # program rebuilt to the same bytes leaves the target up to date.
    MODEL_VALUES: ClassVar[tuple[str, ...]] = MODEL_FIELDS

    @model_validator(mode="after")
    def _a_source_or_a_model(self) -> "TargetParams":
        described = self.checkpoint is not None or self.model_class is not None
        if self.source is not None and described:
            raise ValueError("name a source or describe the model (checkpoint, model_class, ...), not both")
        if self.source is None and (self.checkpoint is None or self.model_class is None):
            raise ValueError("expected a source (a torch_export artifact), or the model: checkpoint and model_class")
        return self

    def implied_source(self) -> dict[str, Any] | None:
        if self.source is not None or self.model_class is None:
            return None
        return {"kind": SOURCE_KIND, **self.model_values()}

    def checkpoint_names(self) -> list[str]:
        # Read through the source: what the program was made from is its fingerprint's.
        return []

    def build_parameters(self) -> dict[str, Any]:
        return {key: value for key, value in super().build_parameters().items() if key not in self.MODEL_VALUES}

    def input_patterns(self, verify_only: bool = False) -> dict[str, list[str]]:
        # Held-out images are the source's: it judges on them, and gives them to its targets.
        return {}


def require_package(module: str, extra: str, kind: str) -> None:
    """:class:`ParameterError` (key ``kind``) naming the extra when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise ParameterError(f"the {kind} kind needs {module}, which is not installed: pip install 'edgebuild[{extra}]'",
                             key="kind")


def check_program_source(kind: str, params: TargetParams, sources: dict[str, ArtifactParams],
                         dynamic: bool = True) -> None:
    """The source is a ``torch_export`` artifact, with no dynamic axis unless the target takes them."""
    assert params.source is not None
    source = sources[params.source]
    if source.kind != SOURCE_KIND:
        raise ParameterError(f"source {params.source!r} is a {source.kind} artifact; expected a {SOURCE_KIND} one",
                             key="source")
    if not dynamic and getattr(source, "dynamic", False):
        raise ParameterError(f"the {kind} target takes fixed shapes only, and {params.source!r} declares dynamic axes; "
                             "fix them, or export one model per shape", key="inputs" if params.model_class else "source")


def program_info(source: Path) -> dict[str, Any]:
    """The source program's ``export.json``: its inputs (with their dynamic axes) and outputs."""
    from edgebuild.core.files import RECORD_BYTES, read_json

    return read_json(source / INFO_FILE, RECORD_BYTES)


def program_path(source: Path) -> Path:
    return source / PROGRAM_FILE


def sizes(info: dict[str, Any]) -> list[dict[str, list[int]]]:
    """The input shapes a target is checked at: every dynamic axis at its smallest, then at
    its largest size (the given shapes when nothing is dynamic)."""
    dynamic = any(spec["dynamic"] for spec in info["inputs"])
    found = []
    for end in (0, 1) if dynamic else (None,):
        shapes = {}
        for spec in info["inputs"]:
            shape = list(spec["shape"])
            for axis, bounds in spec["dynamic"].items():
                shape[int(axis)] = bounds[end] if end is not None else shape[int(axis)]
            shapes[spec["name"]] = shape
        found.append(shapes)
    return found


def random_feeds(info: dict[str, Any], count: int, seed: int) -> Inputs:
    """``count`` seeded inputs at each size (:func:`sizes`): floats from N(0, 1), masks all
    ones, other integers zero."""
    import numpy

    generator = numpy.random.default_rng(seed)
    feeds = []
    for shapes in sizes(info):
        for _ in range(count):
            feed = {}
            for spec in info["inputs"]:
                shape, dtype = shapes[spec["name"]], spec["dtype"]
                if dtype.startswith("float"):
                    feed[spec["name"]] = generator.standard_normal(shape).astype(dtype)
                elif dtype == "bool" or spec["name"].endswith("_mask"):
                    feed[spec["name"]] = numpy.ones(shape, dtype=dtype)
                else:
                    feed[spec["name"]] = numpy.zeros(shape, dtype=dtype)
            feeds.append(feed)
    dynamic = len(sizes(info)) > 1
    return Inputs(feeds, f"{count} random inputs" + (" at the smallest and at the largest dynamic sizes" if dynamic else ""))
