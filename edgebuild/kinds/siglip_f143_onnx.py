"""Kind ``siglip_f143_onnx``: a ``siglip_f143`` artifact as one ONNX graph with FP8 weights.

An NPU or iGPU runtime consumes ONNX, not SafeTensors. ONNX has F143's exact
type (``FLOAT8E4M3FNUZ``) and, from opset 21, blocked ``DequantizeLinear``, so
each quantized linear is stored as its float8 codes plus one power-of-two scale
per 64 input features and output feature (each 64x64 tile's exponent, repeated
over its 64 rows), and dequantized in the graph. onnxruntime's CPU provider
runs that bit-exactly, so the graph computes with exactly the SafeTensors
artifact's weights.

The graph is torch's dynamo export of transformers' ``SiglipVisionModel``
carrying the quantized weights; the exporter folds each linear's weight into a
transposed ``[in, out]`` initializer for ``MatMul``, which is found by value
(not by name or string surgery) and rewritten with the ``onnx`` API. The
blocked axis is therefore the input-feature axis of whichever layout the
exporter chose: axis 0 for ``MatMul``'s ``[in, out]``, axis 1 for ``[out, in]``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from ..errors import CheckpointError, ExportError, ParameterError
from ..report import Check
from . import register
from .base import ArtifactKind, ArtifactParams, BuildContext, Dtype, Strict, Verification, VerifyContext

if TYPE_CHECKING:
    import torch

    from ..checkpoint import Checkpoint

MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
INFO_FILE = "export.json"
SOURCE_KIND = "siglip_f143"

# onnxruntime vs the quantized PyTorch encoder, relative to the output's largest
# magnitude: the weights are identical, so only float rounding of the activations
# differs (measured: see the README).
DEFAULT_QUANTIZED_MAX_REL = {"float32": 1e-4, "float16": 1e-2}


class SiglipOnnxVerify(Strict):
    cosine_min: float = Field(default=0.99, ge=-1.0, le=1.0, description="vs the float encoder: the quantization error.")
    mean_abs: float | None = Field(default=None, ge=0.0, description="vs the float encoder.")
    quantized_max_rel: float | None = Field(
        default=None, ge=0.0, description="vs the quantized PyTorch encoder (float rounding only), relative."
    )
    max_quantized_weight_ratio: float = Field(
        default=0.3, gt=0.0, description="bytes of FP8 codes + scales / bytes of the same weights in float32."
    )
    samples: int = Field(default=2, ge=1, le=16, description="Random inputs, when the source has no usable images.")
    seed: int = 0


class SiglipOnnxParams(ArtifactParams):
    kind: Literal["siglip_f143_onnx"]
    source: str = Field(description="The siglip_f143 artifact to export.")
    image_size: int | None = Field(default=None, gt=0, description="Default: the checkpoint's.")
    opset: int = Field(default=21, ge=21, description="Blocked DequantizeLinear needs 21.")
    dtype: Dtype = "float32"
    weights: Literal["fp8", "float"] = "fp8"
    verify: SiglipOnnxVerify = Field(default_factory=SiglipOnnxVerify)


def _load_quantized(source: Path) -> tuple[Any, dict[str, Any], list[str]]:
    """The quantized SiglipVisionModel from a built siglip_f143 directory, strictly."""
    from safetensors.torch import load_file
    from transformers import SiglipVisionConfig, SiglipVisionModel
    from transformers.initialization import no_init_weights

    config = json.loads((source / "config.json").read_text())
    vision = config["vision_config"]
    with no_init_weights():
        model = SiglipVisionModel(SiglipVisionConfig(**vision))
    missing, unexpected = model.load_state_dict(load_file(str(source / "model.safetensors")), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{source / 'model.safetensors'}: does not match SiglipVisionModel ({missing[:3]}, {unexpected[:3]})")
    quantized = json.loads((source / "quantization.json").read_text())["quantized_linears"]
    return model.eval(), vision, quantized


def _encoder_class() -> type:
    import torch

    class Encoder(torch.nn.Module):
        """pixel_values -> last_hidden_state (and pooler_output when the model has a head)."""

        def __init__(self, model: Any, interpolate: bool) -> None:
            super().__init__()
            self.model = model
            self.interpolate = interpolate

        def forward(self, pixel_values: torch.Tensor) -> Any:
            output = self.model(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate)
            if output.pooler_output is None:
                return output.last_hidden_state
            return output.last_hidden_state, output.pooler_output

    return Encoder


def _pixels(image_size: int, count: int, seed: int) -> list["torch.Tensor"]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    # SigLIP's processor maps pixels to [-1, 1].
    return [torch.rand(1, 3, image_size, image_size, generator=generator) * 2 - 1 for _ in range(count)]


def _fp8_layout(weight: "torch.Tensor", block_size: int, arrays: dict[str, Any], used: set[str]) -> tuple[str, int] | None:
    """Which initializer holds ``weight``, and its input-feature axis: found by value."""
    import numpy

    expected = weight.detach().numpy()
    for name, array in arrays.items():
        if name in used or array.ndim != 2:
            continue
        if array.shape == expected.T.shape and numpy.array_equal(array, expected.T.astype(array.dtype)):
            return name, 0
        if array.shape == expected.shape and numpy.array_equal(array, expected.astype(array.dtype)):
            return name, 1
    return None


def rewrite_fp8(model_path: Path, state: dict[str, "torch.Tensor"], quantized: list[str], block_size: int, dtype: str) -> dict[str, Any]:
    """Rewrite the initializers of the ``quantized`` weights as FLOAT8E4M3FNUZ + blocked
    DequantizeLinear; save with external data. Every quantized weight must be found."""
    import onnx
    import torch
    from onnx import TensorProto

    from ..f143 import pack
    from ..onnx_tools import initializer_arrays, replace_with_blocked_fp8, save_with_external_data

    model = onnx.load(str(model_path))
    arrays = initializer_arrays(model)
    used: set[str] = set()
    rewritten = {}
    for name in quantized:
        weight = state[name]
        match = _fp8_layout(weight.to(torch.float16) if dtype == "float16" else weight, block_size, arrays, used)
        if match is None:
            raise ExportError(f"{name}: no initializer of the exported graph holds this weight; cannot store it as FP8")
        initializer, axis = match
        used.add(initializer)
        codes, exponents = pack(weight, block_size)
        rows, cols = weight.shape
        # One scale per (output feature, 64 input features): the tile's exponent over its 64 rows.
        scales = torch.exp2(exponents.float()).repeat_interleave(block_size, dim=0)[:rows]
        codes_array = codes.view(torch.uint8).numpy()
        scales_array = scales.numpy()
        if axis == 0:
            codes_array, scales_array = codes_array.T, scales_array.T
        replace_with_blocked_fp8(
            model, initializer, codes_array, scales_array, axis, block_size,
            output_dtype=TensorProto.FLOAT16 if dtype == "float16" else None,
        )
        rewritten[name] = {"initializer": initializer, "axis": axis, "shape": [rows, cols]}
    save_with_external_data(model, model_path)
    return rewritten


@register
class SiglipF143Onnx(ArtifactKind):
    name = "siglip_f143_onnx"
    summary = "F143 SigLIP encoder -> ONNX with FP8 (FLOAT8E4M3FNUZ) weights"
    Params = SiglipOnnxParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, "Checkpoint"]) -> None:
        assert isinstance(params, SiglipOnnxParams)
        if len(checkpoints) != 1:
            raise ParameterError(f"expected one float checkpoint behind {params.source!r}, found {len(checkpoints)}", key="source")

    def build(self, context: BuildContext) -> dict[str, Any]:
        import torch

        from ..onnx_tools import export_onnx, graph_summary, sanitize_allowzero

        params = context.params
        assert isinstance(params, SiglipOnnxParams)
        source = context.sources[params.source]
        if not (source / "quantization.json").is_file():
            raise ParameterError(f"{params.source!r} is not a {SOURCE_KIND} artifact (no quantization.json)", key="source")
        timings: dict[str, float] = {}
        started = time.perf_counter()
        model, vision, quantized = _load_quantized(source)
        state = {name: value for name, value in model.state_dict().items()}
        image_size = params.image_size or vision.get("image_size", 224)
        dtype = getattr(torch, params.dtype)
        encoder = _encoder_class()(model.to(dtype), image_size != vision.get("image_size", 224)).eval()
        timings["load_s"] = time.perf_counter() - started

        started = time.perf_counter()
        model_path = context.out_dir / MODEL_FILE
        example = _pixels(image_size, 1, 0)[0].to(dtype)
        outputs = ["last_hidden_state", "pooler_output"] if vision.get("vision_use_head", True) else ["last_hidden_state"]
        export_onnx(encoder, (example,), model_path, ["pixel_values"], outputs, params.opset)
        timings["export_s"] = time.perf_counter() - started
        float_bytes = model_path.stat().st_size + (context.out_dir / WEIGHTS_FILE).stat().st_size

        started = time.perf_counter()
        rewritten: dict[str, Any] = {}
        if params.weights == "fp8":
            block_size = json.loads((source / "quantization.json").read_text())["options"]["block_size"]
            rewritten = rewrite_fp8(model_path, {name: state[name].float() for name in quantized}, quantized, block_size, params.dtype)
        cleared = sanitize_allowzero(model_path)
        timings["rewrite_s"] = time.perf_counter() - started
        total_bytes = model_path.stat().st_size + (context.out_dir / WEIGHTS_FILE).stat().st_size
        context.log(
            f"exported opset {params.opset} {params.dtype}; {len(rewritten)} linears as FP8; "
            f"{total_bytes / 1e6:.2f} MB vs {float_bytes / 1e6:.2f} MB with float weights"
        )
        info = {
            "image_size": image_size,
            "dtype": params.dtype,
            "weights": params.weights,
            "outputs": outputs,
            "rewritten": rewritten,
            "allowzero_cleared": cleared,
            "float_graph_bytes": float_bytes,
            "graph_bytes": total_bytes,
            "ops": graph_summary(model_path)["ops"],
            "timings": timings,
        }
        (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        return info

    def verify(self, context: VerifyContext) -> Verification:
        import numpy
        import onnx
        import torch

        from ..onnx_tools import blocked_fp8_weights, graph_summary, run_session
        from .siglip_f143 import load_vision_model

        params = context.params
        assert isinstance(params, SiglipOnnxParams)
        out = context.out_dir
        info = json.loads((out / INFO_FILE).read_text())
        source = context.sources[params.source]
        quantized_model, vision, quantized = _load_quantized(source)
        (checkpoint,) = context.checkpoints.values()
        float_model, _ = load_vision_model(checkpoint)
        interpolate = info["image_size"] != vision.get("image_size", 224)
        state = quantized_model.state_dict()
        checks: list[Check] = []

        summary = graph_summary(out / MODEL_FILE)
        checks.append(Check.measure("allowzero_reshapes", summary["allowzero_reshapes"], "==", 0))
        if params.weights == "fp8":
            graph = onnx.load(str(out / MODEL_FILE))
            decoded = blocked_fp8_weights(graph)
            wrong = []
            code_bytes = scale_bytes = 0
            for name, meta in info["rewritten"].items():
                entry = decoded.get(meta["initializer"])
                expected = state[name].float().numpy()
                if entry is None:
                    wrong.append(name)
                    continue
                actual = entry["decoded"].T if meta["axis"] == 0 else entry["decoded"]
                if actual.shape != expected.shape or not numpy.array_equal(actual, expected):
                    wrong.append(name)
                code_bytes += entry["code_bytes"]
                scale_bytes += entry["scale_bytes"]
            checks.append(Check.measure("fp8_weights", len(info["rewritten"]) - len(wrong), "==", len(quantized),
                                        "FLOAT8E4M3FNUZ initializers that decode (codes x scales) to exactly the SafeTensors weight"
                                        + (f"; wrong: {', '.join(wrong)}" if wrong else "")))
            float_weight_bytes = sum(state[name].numel() * 4 for name in quantized)
            ratio = (code_bytes + scale_bytes) / float_weight_bytes
            checks.append(Check.measure("quantized_weight_ratio", ratio, "<=", params.verify.max_quantized_weight_ratio,
                                        "FP8 codes + float32 scales vs the same weights in float32"))

        dtype = getattr(torch, params.dtype)
        quantized_model.to(dtype)
        numpy_dtype = numpy.float16 if params.dtype == "float16" else numpy.float32
        inputs, input_note = self._inputs(context, source, checkpoint, info["image_size"])
        results = run_session(out / MODEL_FILE, [{"pixel_values": sample.numpy().astype(numpy_dtype)} for sample in inputs])
        quantized_errors, float_metrics = [], []
        with torch.inference_mode():
            for sample, result in zip(inputs, results):
                actual = torch.from_numpy(result[0].astype(numpy.float32))
                quantized_reference = quantized_model(pixel_values=sample.to(dtype), interpolate_pos_encoding=interpolate).last_hidden_state.float()
                float_reference = float_model(pixel_values=sample, interpolate_pos_encoding=interpolate).last_hidden_state
                quantized_errors.append(((actual - quantized_reference).abs().max() / quantized_reference.abs().max()).item())
                error = (actual - float_reference).abs()
                float_metrics.append({
                    "cosine": torch.nn.functional.cosine_similarity(actual.flatten(), float_reference.flatten(), dim=0).item(),
                    "mean_abs": error.mean().item(),
                    "max_abs": error.max().item(),
                })
        limit = params.verify.quantized_max_rel
        if limit is None:
            limit = DEFAULT_QUANTIZED_MAX_REL[params.dtype]
        checks.append(Check.measure("vs_quantized_torch.max_rel", max(quantized_errors), "<=", limit,
                                    f"max |onnxruntime - quantized SiglipVisionModel ({params.dtype})| / max |reference|, {input_note}"))
        cosine = min(item["cosine"] for item in float_metrics)
        checks.append(Check.measure("vs_float.cosine", cosine, ">=", params.verify.cosine_min,
                                    f"onnxruntime CPU vs the float SiglipVisionModel (the quantization error), {input_note}"))
        mean_abs = sum(item["mean_abs"] for item in float_metrics) / len(float_metrics)
        if params.verify.mean_abs is not None:
            checks.append(Check.measure("vs_float.mean_abs", mean_abs, "<=", params.verify.mean_abs))
        return Verification(
            checks=checks,
            metrics={
                "inputs": input_note,
                "vs_quantized_torch_max_rel": quantized_errors,
                "vs_float": float_metrics,
                "graph_bytes": info["graph_bytes"],
                "float_graph_bytes": info["float_graph_bytes"],
                "graph_ratio": info["graph_bytes"] / info["float_graph_bytes"],
                "graph": summary,
            },
        )

    @staticmethod
    def _inputs(context: VerifyContext, source: Path, checkpoint: "Checkpoint", image_size: int) -> tuple[list[Any], str]:
        """The source artifact's held-out inputs (else its calibration inputs), one image
        per run of the fixed-batch graph; random pixels when their size does not fit."""
        from .siglip_f143 import InputSet, load_pixel_batches

        params = context.params
        assert isinstance(params, SiglipOnnxParams)
        options = json.loads((source / "quantization.json").read_text())["options"]
        for label in ("held_out", "calibration"):
            inputs = InputSet(**options.get(label, {}))
            if inputs.is_empty():
                continue
            batches = load_pixel_batches(inputs, context.input_root, checkpoint, label)
            images = [image[None] for batch in batches for image in batch]
            if images and tuple(images[0].shape[-2:]) == (image_size, image_size):
                return images, f"{len(images)} {label} images of {params.source}"
        return _pixels(image_size, params.verify.samples, params.verify.seed), f"{params.verify.samples} random images"
