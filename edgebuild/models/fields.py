"""A model description, as every exporter and target takes it: which transformers class (or
model family) from which checkpoint, at which input shapes -- some axes dynamic between
two sizes -- which outputs, which dtype. What a family does with it is ``families.py``."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PositiveInt, field_validator, model_validator

from edgebuild.core.kind import Dtype, Strict
from edgebuild.models.inputs import (DynamicInput, HeldOut, check_class_name, check_input_names,
                                     check_output_names, input_spec)

_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# The fields of a model description (what a target describing its model inline implies an export from).
MODEL_FIELDS = ("checkpoint", "model_class", "submodule", "inputs", "outputs", "dtype", "image_size",
                "attn_implementation", "tensor_prefixes", "held_out")


ImageSize = Annotated[
    tuple[PositiveInt, PositiveInt],
    BeforeValidator(lambda value: (value, value) if isinstance(value, int) and not isinstance(value, bool)
                    else tuple(value) if isinstance(value, list) else value,
                    json_schema_input_type=PositiveInt | tuple[PositiveInt, PositiveInt]),
]


class ModelFields(Strict):
    """What model, at which shapes: the ``hf_onnx`` keys, plus ``submodule`` and ``image_size``."""

    checkpoint: str = Field(description="The checkpoint (a name under checkpoints:).")
    model_class: str = Field(
        description="A transformers model class by name (CLIPVisionModel, Dinov2Model, WhisperModel, ...), or a model "
                    "family's (Qwen3_5VisionModel: the Qwen3.5 vision tower at image_size).",
    )
    submodule: str | None = Field(
        default=None,
        description="A module of the model to export alone, by attribute path (vision_model, encoder, ...), with "
                    "only its own inputs.",
    )
    inputs: dict[str, Annotated[DynamicInput, BeforeValidator(input_spec, json_schema_input_type=list[PositiveInt] | DynamicInput)]] | None = Field(
        default=None,
        description="Each forward() argument: name -> shape, or {shape, dtype, dynamic}. The Qwen3.5 tower takes "
                    "image_size instead.",
    )
    outputs: list[str] | None = Field(
        default=None,
        description="Fields of the model's output, in order (default: last_hidden_state; the tower's: embeds).",
    )
    dtype: Dtype = Field(default="float32", description="The model's dtype in the exported program.")
    image_size: ImageSize | None = Field(
        default=None, description="The Qwen3.5 tower's image side, or [height, width] (that family only).",
    )
    attn_implementation: Literal["sdpa", "eager"] | None = Field(
        default=None, description="transformers' attention implementation (default: the model's own choice).",
    )
    tensor_prefixes: list[str] | None = Field(
        default=None,
        description="Read only the checkpoint tensors under these name prefixes: the fingerprint covers just those.",
    )
    held_out: HeldOut = Field(
        default_factory=HeldOut,
        description="Images, tensors files or texts compared beside the random inputs (verification only; every "
                    "target made from the artifact is judged on them too).",
    )

    @model_validator(mode="after")
    def _texts_need_ids(self) -> "ModelFields":
        if self.held_out.texts and "input_ids" not in (self.inputs or {}):
            raise ValueError("held_out texts go through the checkpoint's tokenizer into an 'input_ids' input "
                             f"[batch, length]; the inputs are {', '.join(self.inputs or {}) or 'none'}")
        return self

    @field_validator("model_class")
    @classmethod
    def _a_class_name(cls, value: str) -> str:
        return check_class_name(value)

    @field_validator("submodule")
    @classmethod
    def _a_path(cls, value: str | None) -> str | None:
        if value is not None and (not _PATH.fullmatch(value) or len(value) > 200):
            raise ValueError("expected an attribute path such as 'vision_model' or 'model.encoder'")
        return value

    @field_validator("inputs")
    @classmethod
    def _input_names(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        check_input_names(value or {})
        return value

    @field_validator("outputs")
    @classmethod
    def _output_names(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("expected at least one output")
            check_output_names(value)
        return value

    def input_dtype(self, name: str) -> str:
        """An input's dtype: as given; else int64 for ids and masks, else the model's dtype."""
        given = self.inputs[name].dtype if self.inputs else None
        if given is not None:
            return given
        return "int64" if name.endswith(("_ids", "_mask")) else self.dtype

    def model_values(self) -> dict[str, Any]:
        """The model fields as the manifest gives them (unset ones left out)."""
        # Python values, not JSON: a dynamic axis keeps its integer key through validation again.
        return self.model_dump(include=set(MODEL_FIELDS), exclude_defaults=True)

    @property
    def dynamic(self) -> bool:
        return any(spec.dynamic for spec in (self.inputs or {}).values())
