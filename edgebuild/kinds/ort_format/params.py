"""The ``ort_format`` manifest parameters and the files the kind writes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgebuild.plugin import ArtifactParams, OutputLimits, PerOutputLimits, VerifySettings

MODEL_FILE = "model.ort"
OPERATORS_FILE = "required_operators.config"
INFO_FILE = "ort.json"
INFO_FORMAT = 1
SOURCE_MODEL = "model.onnx"
# The same graph in another file format, run by the same onnxruntime: identical outputs
# up to the optimizations saved with it (measured: cosine 1.0).
DEFAULT_LIMITS = OutputLimits(cosine_min=0.99999, max_rel=1e-4)


class OrtVerify(VerifySettings, PerOutputLimits):
    """The ``.ort`` model against its source ONNX graph, both on onnxruntime's CPU provider."""

    samples: int = Field(default=2, ge=1, le=64, description="Seeded random inputs compared.")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class OrtFormatParams(ArtifactParams):
    kind: Literal["ort_format"]
    source: str = Field(description="An artifact that writes an ONNX graph, model.onnx (hf_onnx, onnx_qdq, a tower, ...).")
    optimization: Literal["fixed", "runtime"] = Field(
        default="fixed",
        description="onnxruntime's optimization style: fixed (optimizations applied now, for a reduced build) or "
                    "runtime (applied where the model runs).",
    )
    verify: OrtVerify = Field(default_factory=OrtVerify, description="Verification thresholds and inputs.")
