"""The manifest parameters of ``hf_onnx``: which transformers class, at which fixed input
shapes, which outputs, and the thresholds against the model's own forward."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, PositiveInt, field_validator, model_validator

from edgebuild.ml.onnx_tools import EXPORTER_MAX_OPSET, EXPORTER_MIN_OPSET
from edgebuild.plugin import ArtifactParams, Dtype, InputFiles, Strict

MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
INFO_FILE = "export.json"
INFO_FORMAT = 1
# An input of more than this many elements is not a fixed-shape encoder input any
# machine exports (a float32 tensor of 2**28 elements is 1 GiB).
MAX_INPUT_ELEMENTS = 1 << 28
MAX_INPUT_DIMS = 6
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
InputDtype = Literal["float32", "float16", "int64", "int32", "bool"]

# Per-dtype defaults of ``verify:``, against the float32 model's own forward. float32:
# the exporter's graph agrees with transformers to about 1e-6 on the tiny encoders.
DEFAULT_LIMITS: dict[str, dict[str, float]] = {
    "float32": {"cosine_min": 0.9999, "max_abs": 1e-4},
    "float16": {"cosine_min": 0.999, "max_abs": 5e-2},
}


class ModelInput(Strict):
    """One graph input: its fixed shape, and its dtype (floating inputs default to the
    export's dtype)."""

    shape: list[PositiveInt] = Field(min_length=1, max_length=MAX_INPUT_DIMS, description="The input's fixed shape.")
    dtype: InputDtype | None = Field(
        default=None,
        description="Its element type; unset, a floating input takes the export's dtype.",
    )

    @field_validator("shape")
    @classmethod
    def _bounded(cls, shape: list[int]) -> list[int]:
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise ValueError(f"{math.prod(shape)} elements; at most {MAX_INPUT_ELEMENTS} (2**28) per input")
        return shape


def _input_spec(value: Any) -> Any:
    # `pixel_values: [1, 3, 224, 224]`: a shape alone.
    return {"shape": value} if isinstance(value, list) else value


class HeldOut(InputFiles):
    """Held-out inputs for verification: images, run through the checkpoint's own image
    processor into the ``pixel_values`` input (resized to its fixed height and width)."""

    images: list[str] = Field(default_factory=list, description="Images (paths or globs) for the pixel_values input.")


class HfOnnxVerify(Strict):
    """Thresholds of ``verify:``, per output; unset ones take the per-dtype defaults."""

    cosine_min: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Least cosine vs the model's forward (unset: 0.9999 float32, 0.999 float16).",
    )
    max_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest absolute error (unset: 1e-4 float32, 5e-2 float16).",
    )
    mean_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest mean absolute error (unset: not checked).",
    )
    samples: int = Field(default=2, ge=1, le=64, description="Seeded random inputs compared (beside held-out images).")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class HfOnnxParams(ArtifactParams):
    kind: Literal["hf_onnx"]
    checkpoint: str = Field(description="The checkpoint (a name under checkpoints:).")
    model_class: str = Field(description="A transformers model class, by name (CLIPVisionModel, Dinov2Model, ...).")
    inputs: dict[str, Annotated[ModelInput, BeforeValidator(_input_spec, json_schema_input_type=list[PositiveInt] | ModelInput)]] = Field(
        min_length=1, description="Each forward() argument given: name -> shape, or {shape, dtype}."
    )
    outputs: list[str] = Field(
        default_factory=lambda: ["last_hidden_state"], min_length=1,
        description="Fields of the model's output, in the graph's order (pooler_output, last_hidden_state, ...).",
    )
    dtype: Dtype = Field(default="float32", description="Export dtype.")
    opset: int = Field(default=21, ge=EXPORTER_MIN_OPSET, le=EXPORTER_MAX_OPSET, description="ONNX opset.")
    attn_implementation: Literal["sdpa", "eager"] | None = Field(
        default=None, description="transformers' attention implementation (default: the model's own choice)."
    )
    tensor_prefixes: list[str] | None = Field(
        default=None,
        description="Read only the checkpoint tensors under these name prefixes (a vision encoder from a two-tower "
                    "checkpoint): the fingerprint covers just those, and the build fails if the class needs another.",
    )
    held_out: HeldOut = Field(
        default_factory=HeldOut,
        description="Images compared beside the random inputs (verification only).",
    )
    verify: HfOnnxVerify = Field(default_factory=HfOnnxVerify, description="Verification thresholds and inputs.")

    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset({"held_out"})

    @field_validator("model_class")
    @classmethod
    def _a_class_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Z][A-Za-z0-9_]{0,99}", value):
            raise ValueError("expected a transformers class name such as 'CLIPVisionModel'")
        return value

    @field_validator("inputs")
    @classmethod
    def _input_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not _NAME.fullmatch(name) or len(name) > 100:
                raise ValueError(f"input name {name!r} is not a forward() argument name")
        return value

    @field_validator("outputs")
    @classmethod
    def _output_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _NAME.fullmatch(name) or len(name) > 100:
                raise ValueError(f"output name {name!r} is not a field name of a model output")
        if len(set(value)) != len(value):
            raise ValueError("each output at most once")
        return value

    @model_validator(mode="after")
    def _held_out_needs_pixels(self) -> "HfOnnxParams":
        if self.held_out.images:
            pixels = self.inputs.get("pixel_values")
            if pixels is None or len(pixels.shape) != 4:
                raise ValueError("held_out images go into a 'pixel_values' input of shape [batch, channels, height, width]")
        return self

    def limits(self) -> dict[str, float | None]:
        defaults = DEFAULT_LIMITS[self.dtype]
        return {
            "cosine_min": self.verify.cosine_min if self.verify.cosine_min is not None else defaults["cosine_min"],
            "max_abs": self.verify.max_abs if self.verify.max_abs is not None else defaults["max_abs"],
            "mean_abs": self.verify.mean_abs,
        }

    def input_dtype(self, name: str) -> str:
        """An input's dtype: as given; else int64 for ids and masks (``input_ids``,
        ``attention_mask``), else the export's dtype (``pixel_values``, ``input_values``)."""
        given = self.inputs[name].dtype
        if given is not None:
            return given
        return "int64" if name.endswith(("_ids", "_mask")) else self.dtype
