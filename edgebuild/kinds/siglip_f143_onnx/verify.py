"""Verifying ``siglip_f143_onnx``: every FP8 initializer decodes to exactly the
SafeTensors weight, the weights' size, and onnxruntime against the quantized PyTorch
encoder on the source's held-out images (and, by the engine along the chain, against
the float encoder on the same images: ``vs_float.*``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from edgebuild.plugin import Check, Inputs, OutputLimits, Verification, VerifyContext
from .model import load_quantized, random_pixels
from .params import DEFAULT_QUANTIZED_MAX_REL, INFO_FILE, MODEL_FILE, SiglipOnnxParams

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint


def verify(context: VerifyContext[SiglipOnnxParams]) -> Verification:
    import numpy
    import onnx
    import torch

    from edgebuild.ml.onnx_tools import blocked_fp8_weights, graph_summary, run_session

    params = context.params
    out = context.out_dir
    info = json.loads((out / INFO_FILE).read_text())
    source = context.source
    quantized_model, vision, quantized = load_quantized(source)
    (checkpoint,) = context.checkpoints.values()
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
    quantized_errors = []
    with torch.inference_mode():
        for sample, result in zip(inputs, results):
            actual = torch.from_numpy(result[0].astype(numpy.float32))
            quantized_reference = quantized_model(pixel_values=sample.to(dtype), interpolate_pos_encoding=interpolate).last_hidden_state.float()
            quantized_errors.append(((actual - quantized_reference).abs().max() / quantized_reference.abs().max()).item())
    limit = params.verify.quantized_max_rel
    if limit is None:
        limit = DEFAULT_QUANTIZED_MAX_REL[params.dtype]
    checks.append(Check.measure("vs_quantized_torch.max_rel", max(quantized_errors), "<=", limit,
                                f"max |onnxruntime - quantized SiglipVisionModel ({params.dtype})| / max |reference|, {input_note}"))
    # Against the float encoder (the quantization error): vs_float.*, judged by the engine
    # along the chain on the same inputs (evaluation_inputs below; float_limits).
    return Verification(
        checks=checks,
        metrics={
            "inputs": input_note,
            "vs_quantized_torch_max_rel": quantized_errors,
            "graph_bytes": info["graph_bytes"],
            "float_graph_bytes": info["float_graph_bytes"],
            "graph_ratio": info["graph_bytes"] / info["float_graph_bytes"],
            "graph": summary,
        },
    )


def _inputs(context: VerifyContext[SiglipOnnxParams], checkpoint: "Checkpoint", image_size: int) -> tuple[list[Any], str]:
    """The source artifact's held-out inputs (else its calibration inputs), one image
    per run of the fixed-batch graph; random pixels when their size does not fit."""
    from edgebuild.models.siglip.model import load_pixel_batches

    params = context.params
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


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def evaluation_inputs(context: VerifyContext[SiglipOnnxParams]) -> Inputs:
    """The source's held-out images (else its calibration images) at the graph's size, one
    per run; seeded random pixels when they are of another size."""
    params = context.params
    (checkpoint,) = context.checkpoints.values()
    info = json.loads((context.out_dir / INFO_FILE).read_text())
    numpy_dtype = "float16" if params.dtype == "float16" else "float32"
    images, note = _inputs(context, checkpoint, info["image_size"])
    return Inputs([{"pixel_values": image.numpy().astype(numpy_dtype)} for image in images], note)


def image_feeds(context: VerifyContext[SiglipOnnxParams], images: list[Any]) -> list[dict[str, Any]]:
    """Images through the checkpoint's own image processor, at the graph's size."""
    from edgebuild.models.hf import pixel_batches
    from edgebuild.models.siglip.model import DEFAULT_IMAGE_PROCESSOR

    params = context.params
    (checkpoint,) = context.checkpoints.values()
    size = json.loads((context.out_dir / INFO_FILE).read_text())["image_size"]
    numpy_dtype = "float16" if params.dtype == "float16" else "float32"
    return [{"pixel_values": batch.numpy().astype(numpy_dtype)}
            for batch in pixel_batches(checkpoint, images, [1, 3, size, size], DEFAULT_IMAGE_PROCESSOR)]


def float_limits(params: SiglipOnnxParams, output: str) -> OutputLimits:
    """The quantization error's limits: ``verify.cosine_min`` and ``verify.mean_abs``."""
    return OutputLimits(cosine_min=params.verify.cosine_min, mean_abs=params.verify.mean_abs)
