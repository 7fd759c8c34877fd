"""The ``siglip_f143_onnx`` manifest parameters and the files the kind writes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgebuild.ml.onnx_tools import EXPORTER_MAX_OPSET
from edgebuild.plugin import ArtifactParams, Dtype, VerifySettings

MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
INFO_FILE = "export.json"

# onnxruntime vs the quantized PyTorch encoder, relative to the output's largest
# magnitude: the weights are identical, so only float rounding of the activations
# differs (measured: see docs/kinds/siglip_f143_onnx.md).
DEFAULT_QUANTIZED_MAX_REL = {"float32": 1e-4, "float16": 1e-2}


class SiglipOnnxVerify(VerifySettings):
    cosine_min: float = Field(
        default=0.99, ge=-1.0, le=1.0,
        description="vs the float encoder (the quantization error): the default of vs_float.cosine_min.",
    )
    mean_abs: float | None = Field(
        default=None, ge=0.0, description="vs the float encoder: the default of vs_float.mean_abs.",
    )
    quantized_max_rel: float | None = Field(
        default=None, ge=0.0, description="vs the quantized PyTorch encoder (float rounding only), relative."
    )
    max_quantized_weight_ratio: float = Field(
        default=0.3, gt=0.0, description="bytes of FP8 codes + scales / bytes of the same weights in float32."
    )
    samples: int = Field(default=2, ge=1, le=16, description="Random inputs, when the source has no usable images.")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class SiglipOnnxParams(ArtifactParams):
    kind: Literal["siglip_f143_onnx"]
    source: str = Field(description="The siglip_f143 artifact to export.")
    image_size: int | None = Field(default=None, gt=0, description="Default: the checkpoint's.")
    opset: int = Field(default=21, ge=21, le=EXPORTER_MAX_OPSET, description="Blocked DequantizeLinear needs 21.")
    dtype: Dtype = Field(default="float32", description="Graph dtype of everything but the FP8 weights.")
    weights: Literal["fp8", "float"] = Field(
        default="fp8",
        description="fp8: FLOAT8E4M3FNUZ codes and scales; float: the quantized weights dequantized.",
    )
    verify: SiglipOnnxVerify = Field(
        default_factory=SiglipOnnxVerify,
        description="Verification thresholds and inputs.",
    )
