"""A model's inputs as a manifest gives them: each by the name of its ``forward()``
argument, with a fixed shape and a dtype (and, for a ``torch.export`` program, axes
dynamic between two sizes); and held-out images for its verification. Shared by
``hf_onnx`` and the ``torch_export`` model description every target takes."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, field_validator, model_serializer, model_validator

from edgebuild.core.checkpoint import TOKENIZER_FILES
from edgebuild.core.kind import InputFiles, Strict

# An input of more than this many elements is not a fixed-shape encoder input any
# machine exports (a float32 tensor of 2**28 elements is 1 GiB).
MAX_INPUT_ELEMENTS = 1 << 28
MAX_INPUT_DIMS = 6
INPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
InputDtype = Literal["float32", "float16", "int64", "int32", "bool"]


def check_class_name(value: str) -> str:
    """``value`` when it can name a transformers class; else ``ValueError``."""
    if not re.fullmatch(r"[A-Z][A-Za-z0-9_]{0,99}", value):
        raise ValueError("expected a transformers class name such as 'CLIPVisionModel'")
    return value


def check_input_names(names: Any) -> None:
    """Each of ``names`` can be a ``forward()`` argument; else ``ValueError``."""
    for name in names:
        if not INPUT_NAME.fullmatch(name) or len(name) > 100:
            raise ValueError(f"input name {name!r} is not a forward() argument name")


def check_output_names(names: list[str]) -> None:
    """Each of ``names`` can be a field of a model output, and is named once; else ``ValueError``."""
    for name in names:
        if not INPUT_NAME.fullmatch(name) or len(name) > 100:
            raise ValueError(f"output name {name!r} is not a field name of a model output")
    if len(set(names)) != len(names):
        raise ValueError("each output at most once")


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


class DynamicInput(ModelInput):
    """An input whose axes may be dynamic, each between two sizes; ``shape`` holds the size
    it is exported at."""

    dynamic: dict[int, Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]] = Field(
        default_factory=dict,
        description="Axis -> [smallest, largest]: the axis is dynamic between those sizes (for targets that take "
                    "dynamic shapes); verified at both.",
    )

    @model_validator(mode="after")
    def _axes_in_the_shape(self) -> "DynamicInput":
        for axis, (smallest, largest) in self.dynamic.items():
            if not 0 <= axis < len(self.shape):
                raise ValueError(f"dynamic: axis {axis} is not an axis of a {len(self.shape)}-d shape")
            if not 2 <= smallest <= largest:
                raise ValueError(f"dynamic: axis {axis}: expected 2 <= smallest <= largest, found [{smallest}, {largest}] "
                                 "(torch.export fixes an axis of size 1)")
            if not smallest <= self.shape[axis] <= largest:
                raise ValueError(f"dynamic: axis {axis}: the shape's {self.shape[axis]} is not within "
                                 f"[{smallest}, {largest}]")
        return self

    def at(self, size: Literal["smallest", "largest", "shape"]) -> list[int]:
        """The shape with every dynamic axis at its smallest or largest size (or as given)."""
        shape = list(self.shape)
        for axis, bounds in self.dynamic.items():
            shape[axis] = bounds[0] if size == "smallest" else bounds[1] if size == "largest" else shape[axis]
        return shape


class FixedUnlessSaid(DynamicInput):
    """A :class:`DynamicInput` of a kind that was fixed-shape before it took dynamic axes:
    with none declared it is written as before (no ``dynamic`` key), so the parameters,
    and the fingerprints made of them, of every existing artifact stay what they were."""

    @model_serializer(mode="wrap")
    def _without_empty_dynamic(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if not data.get("dynamic"):
            data.pop("dynamic", None)
        return data


def input_spec(value: Any) -> Any:
    """``pixel_values: [1, 3, 224, 224]``: a shape alone."""
    return {"shape": value} if isinstance(value, list) else value


def tokenizer_files(checkpoint: Any) -> tuple[str, ...]:
    """The tokenizer files ``checkpoint`` has: what held-out texts read of it (its
    ``TensorSelection.files``, so the fingerprint covers them)."""
    return tuple(name for name in TOKENIZER_FILES if checkpoint.has_file(name))


def read_tokenizer_files(params: Any, checkpoint: Any) -> tuple[str, ...]:
    """The tokenizer files a model description (``inputs``, ``held_out``) reads of
    ``checkpoint``: all it has for a text model (one that takes ``input_ids``: its
    artifacts carry its tokenizer to an application, in ``consumer.json``, so the
    fingerprint covers it) and for held-out texts; none otherwise."""
    return tokenizer_files(checkpoint) if params.held_out.texts or "input_ids" in (params.inputs or {}) else ()


class HeldOut(InputFiles):
    """Held-out inputs for verification: images, run through the checkpoint's own image
    processor into the ``pixel_values`` input (resized to its fixed height and width);
    tensors files for any model (text, audio); text files through the checkpoint's own
    tokenizer (``edgebuild/models/held_out.py``)."""

    images: list[str] = Field(default_factory=list, description="Images (paths or globs) for the pixel_values input.")
    tensors: list[str] = Field(
        default_factory=list,
        description="Tensors files (paths or globs): SafeTensors or NumPy .npz holding one array per model input, "
                    "named as the input, of shape [n, *shape] or [n * batch, ...]; a NumPy .npy for a model of one "
                    "input.",
    )
    texts: list[str] = Field(
        default_factory=list,
        description="Text files (paths or globs), one sample a line, through the checkpoint's own tokenizer into "
                    "input_ids (and attention_mask, token_type_ids where the model takes them), padded or cut to "
                    "the input's length.",
    )

    @model_serializer(mode="wrap")
    def _without_empty_new_roles(self, handler: Any) -> dict[str, Any]:
        # Written as before when unused: the parameters, and the fingerprints made of them,
        # of every existing artifact stay what they were.
        data = handler(self)
        for role in ("tensors", "texts"):
            if not data.get(role):
                data.pop(role, None)
        return data
