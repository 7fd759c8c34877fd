"""The manifest parameters of ``onnx_qdq``: the graph to quantize, its calibration and
held-out inputs, the recipe and types, and the thresholds against the float graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.ml.qdq import QdqOptions
from edgebuild.models.graph_inputs import GraphInputs
from edgebuild.plugin import ArtifactParams, OutputLimits, PerOutputLimits, VerifySettings
from edgebuild.targets.formats import MODEL_FILE, QDQ_INFO_FILE, QDQ_INFO_FORMAT, SIGNATURE_FILE, WEIGHTS_FILE

INFO_FILE, INFO_FORMAT = QDQ_INFO_FILE, QDQ_INFO_FORMAT


def source_signature(source: Path) -> dict[str, Any]:
    """The source graph's inputs by name, as its ``export.json`` says them: ``{name, shape, dtype}``."""
    return {spec["name"]: spec for spec in read_json(source / SIGNATURE_FILE, RECORD_BYTES)["inputs"]}

__all__ = ["INFO_FILE", "INFO_FORMAT", "MODEL_FILE", "SIGNATURE_FILE", "WEIGHTS_FILE", "OnnxQdqParams", "OnnxQdqVerify",
           "source_signature"]

# Default limits against the float graph on the held-out inputs, by activation type (and,
# the same, against the float model at the root of the chain: the float graph agrees
# with it to about 1e-6).
# Measured on the tiny CLIP vision encoder (clip_vision_tiny) with the shipped images (4
# calibration, 2 held out), minmax: QNN recipe A16W8 pooler_output 0.9956 /
# last_hidden_state 0.9963, A8W8 0.9952 / 0.9964; generic recipe int8/int8 0.9914 /
# 0.9959. max |error| / max |float output| on the held-out images, clip_vision_tiny and
# dinov2_tiny, pooler_output and last_hidden_state: A16W8 0.10-0.14, A8W8 0.13-0.19,
# generic int8 0.12-0.15 (activations past the ranges four images calibrate are
# clipped); a wrong range puts it near 1. Absolute errors depend on the model's scale:
# set verify.mean_abs / max_abs.
DEFAULT_LIMITS = {
    "uint16": OutputLimits(cosine_min=0.99, max_rel=0.3), "int16": OutputLimits(cosine_min=0.99, max_rel=0.3),
    "uint8": OutputLimits(cosine_min=0.98, max_rel=0.4), "int8": OutputLimits(cosine_min=0.98, max_rel=0.4),
}


class OnnxQdqVerify(VerifySettings, PerOutputLimits):
    """Thresholds against the float graph on the held-out inputs, for every output and per
    output (``outputs: {NAME: {...}}``); unset ones take the defaults of the activation type."""

    cosine_min: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Least cosine vs the float graph (unset: 0.99 for 16-bit activations, 0.98 for 8-bit).",
    )
    max_rel: float | None = Field(
        default=None, ge=0.0,
        description="Largest max |error| / max |float graph's output| (unset: 0.3 for 16-bit activations, 0.4 for 8-bit).",
    )
    mean_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest mean absolute error vs the float graph (unset: not checked).",
    )
    max_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest absolute error vs the float graph (unset: not checked).",
    )


class OnnxQdqParams(ArtifactParams):
    kind: Literal["onnx_qdq"]
    source: str = Field(description="The float ONNX graph to quantize: an exported graph with its inputs' signature "
                                    "(an hf_onnx artifact).")
    calibration: GraphInputs = Field(description="Inputs the activation ranges are calibrated on.")
    held_out: GraphInputs = Field(
        default_factory=GraphInputs,
        description="Verification inputs; default: the calibration inputs.",
    )
    recipe: Literal["qnn", "generic"] = Field(
        default="qnn", description="qnn: onnxruntime's configuration for the QNN execution provider; "
                                   "generic: quantize_static in QDQ format, every op type onnxruntime quantizes.")
    activation_type: Literal["uint16", "uint8", "int16", "int8"] = Field(
        default="uint16",
        description="Activation type (16-bit needs opset 21).",
    )
    weight_type: Literal["uint8", "int8", "uint16", "int16"] = Field(default="uint8", description="Weight type.")
    per_channel: bool = Field(default=False, description="One scale per output channel instead of per tensor.")
    calibration_method: Literal["minmax", "entropy", "percentile"] = Field(
        default="minmax",
        description="How activation ranges are chosen from the calibration inputs.",
    )
    verify: OnnxQdqVerify = Field(
        default_factory=OnnxQdqVerify,
        description="Verification thresholds (vs the float graph).",
    )

    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset({"held_out"})

    @model_validator(mode="after")
    def _consistent(self) -> "OnnxQdqParams":
        if self.calibration.is_empty():
            raise ValueError("calibration needs at least one image or tensors file")
        if self.recipe == "qnn" and self.activation_type not in ("uint16", "uint8"):
            raise ValueError(f"the qnn recipe quantizes activations to uint16 or uint8, not {self.activation_type}")
        return self

    def options(self) -> QdqOptions:
        return QdqOptions(activation_type=self.activation_type, weight_type=self.weight_type,
                          per_channel=self.per_channel, calibration_method=self.calibration_method, recipe=self.recipe)

    def default_limits(self) -> OutputLimits:
        """The activation type's defaults, before the manifest's ``verify:``."""
        return DEFAULT_LIMITS[self.activation_type]

    def limits(self, output: str) -> OutputLimits:
        """The limits on ``output``: its own, then those for every output, then the defaults."""
        return self.verify.for_output(output, self.default_limits())

    def reads_images(self) -> bool:
        return bool(self.calibration.images or self.held_out.images)
