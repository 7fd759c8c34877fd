"""Judging the graph: onnxruntime on the CPU against the float32 model's own forward, on
seeded random inputs and held-out images, per output (cosine, max and mean |error|)."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.compare import compare_outputs, worst_case
from edgebuild.plugin import Check, Verification, VerifyContext, expand_inputs

from .model import image_inputs, load_model, outputs_module, random_inputs
from .params import INFO_FILE, MODEL_FILE, HfOnnxParams


def verify(context: VerifyContext) -> Verification:
    import torch

    from edgebuild.ml.onnx_tools import graph_summary, run_session

    params = context.params
    assert isinstance(params, HfOnnxParams)
    info = json.loads((context.out_dir / INFO_FILE).read_text())
    model = load_model(params, context.checkpoint)
    reference_module = outputs_module(model, params)
    samples = random_inputs(params, model.config, params.verify.samples, params.verify.seed)
    described = f"{params.verify.samples} random inputs"
    images = expand_inputs(params.held_out.images, context.input_root, "held_out.images") if params.held_out.images else []
    if images:
        held_out = image_inputs(params, context.checkpoint, images)
        samples += held_out
        described += f" and {len(held_out)} batches of held-out images"
    feeds = [{name: tensor.numpy() for name, tensor in zip(params.inputs, sample)} for sample in samples]
    produced = run_session(context.out_dir / MODEL_FILE, feeds)
    comparisons: dict[str, list[dict[str, float]]] = {name: [] for name in params.outputs}
    with torch.no_grad():
        for sample, outputs in zip(samples, produced):
            # The reference is the float32 model, whatever the graph's dtype.
            reference = reference_module(*(tensor.float() if tensor.is_floating_point() else tensor for tensor in sample))
            for name, expected, actual in zip(params.outputs, reference, outputs):
                comparisons[name].append(compare_outputs(expected.float()[None], torch.from_numpy(actual).float()[None]))
    limits = params.limits()
    checks = []
    measured = {}
    for name in params.outputs:
        worst = worst_case(comparisons[name])
        measured[name] = worst
        note = f"onnxruntime CPU vs {params.model_class}.forward (float32), {described}"
        checks.append(Check.measure(f"{name}.cosine", worst["cosine"], ">=", limits["cosine_min"], note))
        checks.append(Check.measure(f"{name}.max_abs", worst["max_abs"], "<=", limits["max_abs"], note))
        if limits["mean_abs"] is not None:
            checks.append(Check.measure(f"{name}.mean_abs", worst["mean_abs"], "<=", limits["mean_abs"], note))
    summary = graph_summary(context.out_dir / MODEL_FILE)
    checks.append(Check.measure("allowzero_reshapes", summary["allowzero_reshapes"], "==", 0,
                                "Reshape nodes with allowzero=1 (DirectML refuses them)"))
    return Verification(checks=checks, metrics={"outputs": measured, "inputs": described, "graph": summary,
                                                "export": info})
