"""The manifest parameters of ``hf_onnx``: which transformers class, at which input
shapes (fixed, or some axes dynamic between two sizes), which outputs, and the thresholds against the model's own forward."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, PositiveInt, field_validator, model_validator

from edgebuild.ml.onnx_tools import EXPORTER_MAX_OPSET, EXPORTER_MIN_OPSET
from edgebuild.models.inputs import (FixedUnlessSaid, HeldOut, check_class_name, check_input_names,
                                         check_output_names, input_spec)
from edgebuild.plugin import ArtifactParams, Dtype, OutputLimits, PerOutputLimits, VerifySettings
from edgebuild.targets.formats import SIGNATURE_FILE

MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
INFO_FILE = SIGNATURE_FILE
INFO_FORMAT = 1

# Per-dtype defaults of ``verify:``, against the float32 model's own forward, relative to
# each output's scale (an absolute limit would fail a model whose outputs run to the
# hundreds at an error of a few millionths). Measured on the tiny encoders of the tests
# (docs/kinds/hf_onnx.md): float32 max_rel about 1e-6, float16 about 1e-3.
DEFAULT_LIMITS: dict[str, OutputLimits] = {
    "float32": OutputLimits(cosine_min=0.9999, max_rel=1e-4),
    "float16": OutputLimits(cosine_min=0.999, max_rel=1e-2),
}


class HfOnnxVerify(VerifySettings, PerOutputLimits):
    """Thresholds of ``verify:`` against the model's own forward, for every output and per
    output (``outputs: {NAME: {...}}``); unset ones take the per-dtype defaults."""

    cosine_min: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Least cosine vs the model's forward (unset: 0.9999 float32, 0.999 float16).",
    )
    max_rel: float | None = Field(
        default=None, ge=0.0,
        description="Largest max |error| / max |reference| of the output (unset: 1e-4 float32, 1e-2 float16).",
    )
    max_abs: float | None = Field(
        default=None, ge=0.0,
        description="Largest absolute error (unset: not checked; max_rel fits outputs of any scale).",
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
    inputs: dict[str, Annotated[FixedUnlessSaid, BeforeValidator(input_spec, json_schema_input_type=list[PositiveInt] | FixedUnlessSaid)]] = Field(
        min_length=1, description="Each forward() argument given: name -> shape, or {shape, dtype, dynamic} (dynamic: "
                                  "axis -> [smallest, largest], for the graph's consumers that take dynamic shapes)."
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
        description="Images, tensors files or texts compared beside the random inputs (verification only; every "
                    "artifact made from this one is judged on them too).",
    )
    verify: HfOnnxVerify = Field(default_factory=HfOnnxVerify, description="Verification thresholds and inputs.")

    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset({"held_out"})

    @field_validator("model_class")
    @classmethod
    def _a_class_name(cls, value: str) -> str:
        return check_class_name(value)

    @field_validator("inputs")
    @classmethod
    def _input_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_input_names(value)
        return value

    @field_validator("outputs")
    @classmethod
    def _output_names(cls, value: list[str]) -> list[str]:
        check_output_names(value)
        return value

    @model_validator(mode="after")
    def _limits_name_outputs(self) -> "HfOnnxParams":
        for key, named in (("verify.outputs", self.verify.outputs), ("verify.vs_float.outputs", self.verify.vs_float.outputs)):
            unknown = [name for name in named if name not in self.outputs]
            if unknown:
                raise ValueError(f"{key}: {unknown[0]!r} is not one of the outputs ({', '.join(self.outputs)})")
        return self

    @model_validator(mode="after")
    def _held_out_needs_pixels(self) -> "HfOnnxParams":
        if self.held_out.images:
            pixels = self.inputs.get("pixel_values")
            if pixels is None or len(pixels.shape) != 4:
                raise ValueError("held_out images go into a 'pixel_values' input of shape [batch, channels, height, width]")
        if self.held_out.texts and "input_ids" not in self.inputs:
            raise ValueError("held_out texts go through the checkpoint's tokenizer into an 'input_ids' input "
                             f"[batch, length]; the inputs are {', '.join(self.inputs)}")
        return self

    def limits(self, output: str) -> OutputLimits:
        """The limits on ``output``: its own, then those for every output, then the dtype's defaults."""
        return self.verify.for_output(output, DEFAULT_LIMITS[self.dtype])

    @property
    def dynamic(self) -> bool:
        return any(spec.dynamic for spec in self.inputs.values())

    def input_dtype(self, name: str) -> str:
        """An input's dtype: as given; else int64 for ids and masks (``input_ids``,
        ``attention_mask``), else the export's dtype (``pixel_values``, ``input_values``)."""
        given = self.inputs[name].dtype
        if given is not None:
            return given
        return "int64" if name.endswith(("_ids", "_mask")) else self.dtype
