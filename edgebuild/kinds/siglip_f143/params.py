"""The ``siglip_f143`` manifest parameters (the seed's options, with its defaults) and
the files the kind writes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgebuild.plugin import ArtifactParams, InputSet, Strict

LINEAR_SUFFIXES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "mlp.fc1",
    "mlp.fc2",
)
MODEL_FILE = "model.safetensors"
PACKED_FILE = "model.f143.safetensors"
REPORT_FILE = "quantization.json"


class SiglipVerify(Strict):
    """Thresholds on the quantized encoder's ``last_hidden_state`` vs the float one."""

    cosine_min: float = Field(default=0.99, ge=-1.0, le=1.0)
    mean_abs: float | None = Field(default=None, ge=0.0)
    max_abs: float | None = Field(default=None, ge=0.0)


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
    checkpoint: str
    calibration: InputSet
    held_out: InputSet = Field(default_factory=InputSet)
    algorithm: Literal["gptq", "nearest"] = "gptq"
    block_size: int = Field(default=64, gt=0)
    damp: float = Field(default=0.01, ge=0.0)
    bias_correction: bool = True
    sequential_layers: bool = False
    equalize_layernorm: bool = False
    equalization_scale_limit: float = Field(default=16.0, ge=1.0)
    equalization_identity_candidate: bool = Field(
        default=False, description="Also consider no scaling (the seed does not)."
    )
    layers: int | Literal["all"] = "all"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    sorted_metadata: bool = Field(default=False, description="Deterministic SafeTensors header (the seed's varies).")
    verify: SiglipVerify = Field(default_factory=SiglipVerify)

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
