"""Building ``siglip_f143_onnx``: export the quantized encoder with torch's dynamo
exporter, then rewrite each quantized weight's initializer as FP8 codes, scales
and a blocked ``DequantizeLinear`` with the ``onnx`` API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.models.siglip.f143 import REPORT_FILE as SOURCE_REPORT_FILE
from edgebuild.plugin import BuildContext, ExportError, Phases

from .model import encoder_class, load_quantized, random_pixels
from .params import INFO_FILE, MODEL_FILE, WEIGHTS_FILE, SiglipOnnxParams

if TYPE_CHECKING:
    import torch


def build(context: BuildContext[SiglipOnnxParams]) -> dict[str, Any]:
    import torch

    from edgebuild.ml.onnx_tools import export_onnx, graph_summary, sanitize_allowzero

    params = context.params
    source = context.source
    phases = Phases()
    with phases.time("load"):
        model, vision, quantized = load_quantized(source)
        state = {name: value for name, value in model.state_dict().items()}
        image_size = params.image_size or vision.get("image_size", 224)
        dtype = getattr(torch, params.dtype)
        encoder = encoder_class()(model.to(dtype), image_size != vision.get("image_size", 224)).eval()

    model_path = context.out_dir / MODEL_FILE
    outputs = ["last_hidden_state", "pooler_output"] if vision.get("vision_use_head", True) else ["last_hidden_state"]
    with phases.time("export"):
        example = random_pixels(image_size, 1, 0)[0].to(dtype)
        export_onnx(encoder, (example,), model_path, ["pixel_values"], outputs, params.opset)
    float_bytes = model_path.stat().st_size + (context.out_dir / WEIGHTS_FILE).stat().st_size

    rewritten: dict[str, Any] = {}
    with phases.time("rewrite"):
        if params.weights == "fp8":
            block_size = json.loads((source / SOURCE_REPORT_FILE).read_text())["options"]["block_size"]
            rewritten = rewrite_fp8(model_path, {name: state[name].float() for name in quantized}, quantized, block_size, params.dtype)
        cleared = sanitize_allowzero(model_path)
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
    }
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info | {"timings": phases.seconds}


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

    from edgebuild.ml.quant.f143 import pack
    from edgebuild.ml.onnx_tools import initializer_arrays, replace_with_blocked_fp8, save_with_external_data

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
