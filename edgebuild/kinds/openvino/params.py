"""The ``openvino`` manifest parameters and the files the kind writes."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from edgebuild.models.graph_inputs import GraphInputs
from edgebuild.plugin import OutputLimits
from edgebuild.targets.params import TargetParams

MODEL_FILE = "model.xml"
WEIGHTS_FILE = "model.bin"
INFO_FILE = "openvino.json"
INFO_FORMAT = 1
EXTRA = "openvino"
# The CPU plugin in float32 (the f32 precision hint) against the program: about 1e-7
# (cosine 0.99999995 on the tiny encoders); INT8 by NNCF, like an 8-bit QDQ graph.
DEFAULT_LIMITS = {"none": OutputLimits(cosine_min=0.9999, max_rel=1e-3),
                  "int8": OutputLimits(cosine_min=0.98, max_rel=0.4)}


class OpenvinoParams(TargetParams):
    kind: Literal["openvino"]
    quantize: Literal["none", "int8"] = Field(
        default="none", description="int8: NNCF's post-training quantization on the calibration inputs.",
    )
    calibration: GraphInputs = Field(
        default_factory=GraphInputs,
        description="What int8 calibrates on: images through the checkpoint's image processor into pixel_values, "
                    "and/or SafeTensors files of one tensor per input (as onnx_qdq takes them).",
    )
    device: Literal["CPU"] = Field(default="CPU", description="The plugin the IR is compiled for and run on here.")

    # The calibration files are the build's; the model fields are the source's.
    VERIFY_ONLY_INPUTS: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="after")
    def _int8_calibrates(self) -> "OpenvinoParams":
        if self.quantize == "int8" and self.calibration.is_empty():
            raise ValueError("quantize: int8 needs calibration inputs (images or tensors)")
        if self.quantize == "none" and not self.calibration.is_empty():
            raise ValueError("calibration is for quantize: int8")
        return self

    def input_patterns(self, verify_only: bool = False) -> dict[str, list[str]]:
        if verify_only:
            return {}
        return {f"calibration.{role}": patterns for role, patterns in self.calibration.roles().items()}
