"""The tower's manifest parameters and its thresholds (its geometry is the model's:
``edgebuild/models/qwen3_5/geometry.py``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PositiveInt, field_validator

from edgebuild.ml.onnx_tools import EXPORTER_MAX_OPSET, EXPORTER_MIN_OPSET
from edgebuild.models.qwen3_5.geometry import MODEL_FILE, WEIGHTS_FILE
from edgebuild.plugin import ArtifactParams, Dtype, VerifySettings

__all__ = ["DEFAULT_LIMITS", "MODEL_FILE", "WEIGHTS_FILE", "WRAPPER_TOLERANCE", "TowerParams", "TowerVerify"]

# The fixed-shape module must reproduce the model's own forward this closely
# (or exactly) before it is exported; anything looser exports a different model.
WRAPPER_TOLERANCE = 1e-4
# The largest image side the manifest takes: 8192 px at patch 16 is 262 144 patches,
# whose attention alone needs hundreds of GiB -- past any machine a tower is exported on.
MAX_IMAGE_SIDE = 8192
# Per-dtype defaults for the manifest's ``verify:`` thresholds, against the
# float32 model's own forward. float16 figures measured on the tiny fixture:
# see docs/kinds/qwen3_5_vision_tower.md.
DEFAULT_LIMITS: dict[str, dict[str, float]] = {
    "float32": {"cosine_min": 0.9999, "max_abs": 1e-4, "mean_abs": 1e-5},
    "float16": {"cosine_min": 0.999, "max_abs": 1e-2, "mean_abs": 1e-3},
}


def _normalise_image_size(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    # YAML gives a list; the field is a pair.
    return tuple(value) if isinstance(value, list) else value


class TowerVerify(VerifySettings):
    """Thresholds of ``verify:``; unset ones take the per-dtype defaults."""

    cosine_min: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Least cosine of the graph's output vs the float32 model's (float32: 0.9999, float16: 0.999).",
    )
    max_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest absolute error allowed (float32: 1e-4, float16: 1e-2).",
    )
    mean_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest mean absolute error allowed (float32: 1e-5, float16: 1e-3).",
    )
    samples: int = Field(default=2, ge=1, le=64, description="Random inputs compared.")
    seed: int = Field(default=0, description="Seed of the random inputs.")
    providers: list[str] = Field(
        default_factory=lambda: ["CPUExecutionProvider"],
        description="onnxruntime execution providers whose node placement is checked.",
    )
    min_provider_fraction: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Share of executed nodes that must run on each provider."
    )
    max_gather_nodes: int = Field(default=0, ge=0, description="Gather nodes allowed in the graph.")


class TowerParams(ArtifactParams):
    kind: Literal["qwen3_5_vision_tower"]
    checkpoint: str = Field(
        description="The checkpoint (a name under checkpoints:) whose model.visual.* tensors are the tower.",
    )
    image_size: Annotated[
        tuple[int, int],
        BeforeValidator(_normalise_image_size, json_schema_input_type=PositiveInt | tuple[PositiveInt, PositiveInt]),
    ] = Field(description="Image side in pixels, or [height, width].")
    dtype: Dtype = Field(
        default="float32",
        description="Export dtype (fp32 and float are float32; fp16 and half are float16).",
    )
    opset: int = Field(
        default=21, ge=EXPORTER_MIN_OPSET, le=EXPORTER_MAX_OPSET, description="ONNX opset (16-bit QDQ needs 21)."
    )
    attn_implementation: Literal["sdpa", "eager"] = Field(
        default="sdpa",
        description="transformers' attention implementation the tower is exported with.",
    )
    verify: TowerVerify = Field(default_factory=TowerVerify, description="Verification thresholds and inputs.")

    @field_validator("image_size")
    @classmethod
    def _positive(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) <= 0:
            raise ValueError("image sizes must be positive")
        if max(value) > MAX_IMAGE_SIDE:
            raise ValueError(f"image sizes must be at most {MAX_IMAGE_SIDE}")
        return value

    def limits(self) -> dict[str, float]:
        defaults = DEFAULT_LIMITS[self.dtype]
        return {key: getattr(self.verify, key) if getattr(self.verify, key) is not None else defaults[key] for key in defaults}
