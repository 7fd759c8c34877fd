"""The ``siglip_f143`` manifest parameters (the seed's options, with its defaults) and
the files the kind writes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgebuild.models.siglip.f143 import MODEL_FILE, PACKED_FILE, REPORT_FILE
from edgebuild.plugin import ArtifactParams, InputSet, VerifySettings

__all__ = ["LINEAR_SUFFIXES", "MODEL_FILE", "PACKED_FILE", "REPORT_FILE", "SiglipF143Params", "SiglipVerify"]

LINEAR_SUFFIXES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "mlp.fc1",
    "mlp.fc2",
)


class SiglipVerify(VerifySettings):
    """Thresholds on the quantized encoder's ``last_hidden_state`` vs the float one."""

    cosine_min: float = Field(
        default=0.99, ge=-1.0, le=1.0,
        description="Least cosine, quantized vs float last_hidden_state, worst batch.",
    )
    mean_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest mean absolute error allowed (unset: not checked).",
    )
    max_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest absolute error allowed (unset: not checked).",
    )


def _schema_of_the_validators(schema: dict[str, Any]) -> None:
    """What the validators below check, in the manifest's JSON Schema."""
    properties = schema["properties"]
    properties["layers"]["anyOf"][0]["minimum"] = 1
    properties["calibration"]["anyOf"] = [
        {"required": [key], "properties": {key: {"minItems": 1}}} for key in ("pixel_values", "images")
    ]


class SiglipF143Params(ArtifactParams):
    model_config = ConfigDict(json_schema_extra=_schema_of_the_validators)

    kind: Literal["siglip_f143"]
    checkpoint: str = Field(
        description="The SigLIP checkpoint (a name under checkpoints:): config, weights in any SigLIP layout, preprocessor_config.json.",
    )
    calibration: InputSet = Field(
        description="What the Hessians are collected on: pixel_values files and/or images (at least one).",
    )
    held_out: InputSet = Field(
        default_factory=InputSet,
        description="Inputs verification compares on (verification only).",
    )
    algorithm: Literal["gptq", "nearest"] = Field(
        default="gptq",
        description="GPTQ reconstruction, or nearest rounding onto the grid.",
    )
    block_size: int = Field(default=64, gt=0, description="Columns GPTQ reconstructs at a time.")
    damp: float = Field(
        default=0.01, ge=0.0,
        description="Diagonal damping of the Hessian, as a fraction of its mean diagonal.",
    )
    bias_correction: bool = Field(default=True, description="bias += (W - Wq) @ mean(x) after quantizing a linear.")
    sequential_layers: bool = Field(
        default=False,
        description="Collect each layer's inputs again after its predecessors were quantized.",
    )
    equalize_layernorm: bool = Field(
        default=False,
        description="Fold activation-aware scales into each LayerNorm and its consumers first.",
    )
    equalization_scale_limit: float = Field(default=16.0, ge=1.0, description="Largest equalization scale.")
    equalization_identity_candidate: bool = Field(
        default=False, description="Also consider no scaling (the seed does not)."
    )
    layers: int | Literal["all"] = Field(
        default="all",
        description="Quantize the first N encoder layers (the model keeps only those), or all.",
    )
    device: Literal["cpu", "cuda", "auto"] = Field(default="cpu", description="Where the reconstruction runs.")
    sorted_metadata: bool = Field(default=False, description="Sort the SafeTensors header's tensor entries too (on CPU its metadata keys are always sorted; the seed's order varies).")
    verify: SiglipVerify = Field(default_factory=SiglipVerify, description="Verification thresholds.")

    @field_validator("layers")
    @classmethod
    def _positive_layers(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("layers must be at least 1 (or 'all')")
        return value

    @model_validator(mode="after")
    def _has_calibration(self) -> "SiglipF143Params":
        if self.calibration.is_empty():
            raise ValueError("calibration needs at least one pixel_values file or image")
        return self
