"""Verifying ``siglip_f143_onnx``: every FP8 initializer decodes to exactly the
SafeTensors weight, the weights' size, and onnxruntime against the quantized and
the float PyTorch encoders on the source's held-out images."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from edgebuild.plugin import Check, Verification, VerifyContext
from .model import load_quantized, random_pixels
from .params import DEFAULT_QUANTIZED_MAX_REL, INFO_FILE, MODEL_FILE, SiglipOnnxParams

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint


def verify(context: VerifyContext) -> Verification:
    import numpy
    import onnx
    import torch

    from edgebuild.ml.onnx_tools import blocked_fp8_weights, graph_summary, run_session
    from edgebuild.ml.siglip import load_vision_model

    params = context.params
    assert isinstance(params, SiglipOnnxParams)
    out = context.out_dir
    info = json.loads((out / INFO_FILE).read_text())
    source = context.sources[params.source]
    quantized_model, vision, quantized = load_quantized(source)
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
    inputs, input_note = _inputs(context, checkpoint, info["image_size"])
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


def _inputs(context: VerifyContext, checkpoint: "Checkpoint", image_size: int) -> tuple[list[Any], str]:
    """The source artifact's held-out inputs (else its calibration inputs), one image
    per run of the fixed-batch graph; random pixels when their size does not fit."""
    from edgebuild.ml.siglip import load_pixel_batches

    params = context.params
    assert isinstance(params, SiglipOnnxParams)
    source_params = context.source_params[params.source]
    for label in ("held_out", "calibration"):
        inputs = getattr(source_params, label)
        if inputs.is_empty():
            continue
        batches = load_pixel_batches(inputs, context.input_root, checkpoint, label)
        images = [image[None] for batch in batches for image in batch]
        if images and tuple(images[0].shape[-2:]) == (image_size, image_size):
            return images, f"{len(images)} {label} images of {params.source}"
    return random_pixels(image_size, params.verify.samples, params.verify.seed), f"{params.verify.samples} random images"
