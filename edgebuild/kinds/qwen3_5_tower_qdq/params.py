"""The ``qwen3_5_tower_qdq`` manifest parameters, its thresholds and the files it writes."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from edgebuild.ml.qdq import QdqOptions
from edgebuild.models.qwen3_5.geometry import PREPROCESSOR_FILE
from edgebuild.models.qwen3_5.inputs import TowerInputs
from edgebuild.plugin import ArtifactParams, VerifySettings
from edgebuild.targets.formats import MODEL_FILE, QDQ_INFO_FILE, QDQ_INFO_FORMAT, WEIGHTS_FILE

INFO_FILE, INFO_FORMAT = QDQ_INFO_FILE, QDQ_INFO_FORMAT

__all__ = ["INFO_FILE", "INFO_FORMAT", "MODEL_FILE", "PREPROCESSOR_FILE", "WEIGHTS_FILE", "QdqParams", "QdqVerify"]

# Default thresholds against the float32 tower graph on the held-out images. Measured
# on the tiny fixture with the shipped images (4 calibration, 2 held out), minmax:
# A16W8 cosine 0.9962 / 0.9949 (64x64 / 128x128), mean abs 0.033 / 0.036, max abs
# 0.20 / 0.27; per-channel weights 0.9968 / 0.9956; A8W8 0.9959 / 0.9945, mean abs
# 0.036 / 0.040, max abs 0.19 / 0.30. With four calibration images the held-out error
# is mostly held-out activations beyond the calibrated ranges (clipped): on the
# calibration images themselves A16W8 reaches cosine 0.99957 and A16W16 1.0000 (mean
# abs 1e-4), on the held-out ones both ~0.996. Entropy calibration clips harder:
# 0.9894, mean abs 0.053, max abs 0.42. The defaults admit every method on these
# inputs with some room, and still fail a broken quantization (a wrong range).
DEFAULT_LIMITS: dict[str, dict[str, float]] = {
    "uint16": {"cosine_min": 0.98, "mean_abs": 0.08, "max_abs": 0.6},
    "uint8": {"cosine_min": 0.975, "mean_abs": 0.1, "max_abs": 0.8},
}


class QdqVerify(VerifySettings):
    """Thresholds against the float32 tower graph on the held-out inputs; unset ones
    take the defaults of the activation type."""

    cosine_min: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Least cosine vs the float graph (unset: 0.98 uint16, 0.975 uint8).",
    )
    mean_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest mean absolute error (unset: 0.08 uint16, 0.1 uint8).",
    )
    max_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest absolute error (unset: 0.6 uint16, 0.8 uint8).",
    )


class QdqParams(ArtifactParams):
    kind: Literal["qwen3_5_tower_qdq"]
    source: str = Field(description="The float32 qwen3_5_vision_tower artifact to quantize.")
    calibration: TowerInputs = Field(description="Inputs the activation ranges are calibrated on.")
    held_out: TowerInputs = Field(
        default_factory=TowerInputs, description="Verification inputs; default: the calibration inputs."
    )
    activation_type: Literal["uint16", "uint8"] = Field(
        default="uint16",
        description="Activation type (uint16: A16W8, needs the source at opset 21).",
    )
    weight_type: Literal["uint8", "int8", "uint16"] = Field(default="uint8", description="Weight type.")
    per_channel: bool = Field(default=False, description="One scale per output channel instead of per tensor.")
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        default="minmax",
        description="How activation ranges are chosen from the calibration inputs.",
    )
    verify: QdqVerify = Field(default_factory=QdqVerify, description="Verification thresholds (vs the float graph).")

    # Held-out inputs only decide the verdict: in the verification fingerprint, not the build's.
    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset({"held_out"})

    @model_validator(mode="after")
    def _has_calibration(self) -> "QdqParams":
        if self.calibration.is_empty():
            raise ValueError("calibration needs at least one image or patches file")
        return self

    def options(self) -> QdqOptions:
        """onnxruntime's QNN recipe with these types."""
        return QdqOptions(activation_type=self.activation_type, weight_type=self.weight_type,
                          per_channel=self.per_channel, calibration_method=self.calibration_method, recipe="qnn")

    def limits(self) -> dict[str, float]:
        defaults = DEFAULT_LIMITS[self.activation_type]
        return {key: getattr(self.verify, key) if getattr(self.verify, key) is not None else defaults[key] for key in defaults}
