"""The ``torch_export`` kind's parameters: a model description (``edgebuild/models/fields.py``)
and the thresholds of the program against the model's own forward."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgebuild.core.kind import ArtifactParams
from edgebuild.core.thresholds import OutputLimits, PerOutputLimits, VerifySettings
from edgebuild.models.fields import ModelFields

# The program against the model's own forward: torch.export traces the same operations.
DEFAULT_LIMITS: dict[str, OutputLimits] = {
    "float32": OutputLimits(cosine_min=0.9999, max_rel=1e-4),
    "float16": OutputLimits(cosine_min=0.999, max_rel=1e-2),
}


class ExportVerify(VerifySettings, PerOutputLimits):
    """The exported program against the model's own forward, per output; unset limits take
    the dtype's defaults (cosine 0.9999 and max_rel 1e-4 in float32)."""

    samples: int = Field(default=2, ge=1, le=64, description="Seeded random inputs compared (beside held-out images).")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class TorchExportParams(ModelFields, ArtifactParams):
    kind: Literal["torch_export"]
    verify: ExportVerify = Field(default_factory=ExportVerify, description="Verification thresholds and inputs.")

    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset({"held_out"})

    def limits(self, output: str) -> OutputLimits:
        return self.verify.for_output(output, DEFAULT_LIMITS[self.dtype])
