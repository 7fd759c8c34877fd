"""What every target's parameters share: the program it lowers (a ``source`` that is a
``torch.export`` program, or the model described inline, which implies one) and how it
is checked: on every size of the program's dynamic axes, against the program and (by the
engine) against the model's own forward. A target knows its lowering and its runtime,
nothing of the model (``edgebuild/models/families.py`` does).

Levels: ``ran`` (executed here, in the target's own runtime, and compared), ``loaded``
(parsed or loaded by its runtime, not executed: a Core ML program on Linux), ``none``.
``verify: {require_level: ran}`` (the default) fails an artifact that did not get there.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from edgebuild.core.kind import ArtifactParams
from edgebuild.core.thresholds import PerOutputLimits, VerifySettings
from edgebuild.models.fields import MODEL_FIELDS, ModelFields
from edgebuild.targets.formats import PROGRAM_KIND

Level = Literal["ran", "loaded", "none"]
LEVELS: tuple[Level, ...] = ("none", "loaded", "ran")


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
        description=f"A transformers class (or Qwen3_5VisionModel): the model, when no source is named; it implies "
                    f"the {PROGRAM_KIND} artifact <name>.{PROGRAM_KIND}, shared by every target of the same model.",
    )


class TargetParams(TargetModel, ArtifactParams):
    """A target: the program to lower (``source``, or the model inline) and its verification."""

    source: str | None = Field(
        default=None,
        description=f"The {PROGRAM_KIND} artifact to lower (implied when the model is described inline).",
    )
    verify: TargetVerify = Field(default_factory=TargetVerify, description="Verification thresholds and inputs.")

    # The model fields describe the source (the program), not this artifact's bytes: a
    # program rebuilt to the same bytes leaves the target up to date.
    MODEL_VALUES: ClassVar[tuple[str, ...]] = MODEL_FIELDS

    @model_validator(mode="after")
    def _a_source_or_a_model(self) -> "TargetParams":
        described = self.checkpoint is not None or self.model_class is not None
        if self.source is not None and described:
            raise ValueError("name a source or describe the model (checkpoint, model_class, ...), not both")
        if self.source is None and (self.checkpoint is None or self.model_class is None):
            raise ValueError(f"expected a source (a {PROGRAM_KIND} artifact), or the model: checkpoint and model_class")
        return self

    def implied_source(self) -> dict[str, Any] | None:
        if self.source is not None or self.model_class is None:
            return None
        return {"kind": PROGRAM_KIND, **self.model_values()}

    def checkpoint_names(self) -> list[str]:
        # Read through the source: what the program was made from is its fingerprint's.
        return []

    def build_parameters(self) -> dict[str, Any]:
        return {key: value for key, value in super().build_parameters().items() if key not in self.MODEL_VALUES}

    def input_patterns(self, verify_only: bool = False) -> dict[str, list[str]]:
        # Held-out images are the source's: it judges on them, and gives them to its targets.
        return {}
