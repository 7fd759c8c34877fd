"""Judging the graph: onnxruntime on the CPU against the float32 model's own forward, on
seeded random inputs and held-out images, per output (cosine, and the error relative to
the output's scale; absolute errors where the manifest sets them).

The model is also the float model of every chain rooted here (``float_model``): a QDQ
graph made from this graph, and a QNN context made from that, are judged against it.
"""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.plugin import Check, Inputs, Runner, TensorSpec, Verification, VerifyContext, expand_inputs

from edgebuild.models.hf import at_each_size, image_inputs, load_model, outputs_module, random_inputs
from edgebuild.models.held_out import held_out_feeds

from .params import INFO_FILE, MODEL_FILE, HfOnnxParams


def verify(context: VerifyContext[HfOnnxParams]) -> Verification:
    import torch

    from edgebuild.ml.onnx_tools import graph_summary, run_session

    params = context.params
    info = json.loads((context.out_dir / INFO_FILE).read_text())
    model = load_model(params, context.checkpoint)
    reference_module = outputs_module(model, params)
    samples = [sample for sized in at_each_size(params)
               for sample in random_inputs(sized, model.config, params.verify.samples, params.verify.seed)]
    described = f"{len(samples)} random inputs" + (" at the smallest and at the largest dynamic sizes"
                                                  if params.dynamic else "")
    # The graph's own held-out inputs (a root: its chain is itself), made once per judgement.
    held = context.held_out()
    if held is not None:
        samples += [tuple(torch.from_numpy(feed[name]) for name in params.inputs) for feed in held.feeds]
        described += f" and {held.description}"
    produced = run_session(context.out_dir / MODEL_FILE, _feeds(params, samples))
    comparisons: dict[str, list[dict[str, Any]]] = {name: [] for name in params.outputs}
    with torch.no_grad():
        for sample, outputs in zip(samples, produced):
            # The reference is the float32 model, whatever the graph's dtype.
            reference = reference_module(*(tensor.float() if tensor.is_floating_point() else tensor for tensor in sample))
            for name, expected, actual in zip(params.outputs, reference, outputs):
                comparisons[name].append(agreement(expected.float()[None], torch.from_numpy(actual).float()[None]))
    checks = []
    measured = {}
    note = f"onnxruntime CPU vs {params.model_class}.forward (float32), {described}"
    for name in params.outputs:
        measured[name] = worst_agreement(comparisons[name])
        checks += output_checks(name, measured[name], params.limits(name), note)
    summary = graph_summary(context.out_dir / MODEL_FILE)
    checks.append(Check.measure("allowzero_reshapes", summary["allowzero_reshapes"], "==", 0,
                                "Reshape nodes with allowzero=1 (DirectML refuses them)"))
    return Verification(checks=checks, metrics={"outputs": measured, "inputs": described, "graph": summary,
                                                "export": info})


def _held_out(context: VerifyContext[HfOnnxParams]) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The held-out samples (images, tensors files, texts), in the graph's input order, and
    what they are in words."""
    import torch

    params = context.params
    samples: list[tuple[Any, ...]] = []
    said = []
    if params.held_out.images:
        samples += image_inputs(params, context.checkpoint, expand_inputs(params.held_out.images, context.input_root,
                                                                          "held_out.images"))
        said.append(f"{len(samples)} batches of held-out images")
    specs = [TensorSpec(name, tuple(spec.shape), params.input_dtype(name)) for name, spec in params.inputs.items()]
    feeds, told = held_out_feeds(params.held_out, context.input_root, context.checkpoint, specs)
    samples += [tuple(torch.from_numpy(feed[name]) for name in params.inputs) for feed in feeds]
    return samples, said + told


def _feeds(params: HfOnnxParams, samples: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    return [{name: tensor.numpy() for name, tensor in zip(params.inputs, sample)} for sample in samples]


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def float_model(context: VerifyContext[HfOnnxParams]) -> Runner:
    """The model's own forward in float32: the reference of every artifact made from this one."""
    import transformers

    from edgebuild.targets.runners import torch_runner

    params = context.params
    module = outputs_module(load_model(params, context.checkpoint), params)
    inputs = [TensorSpec(name, tuple(spec.shape), params.input_dtype(name)) for name, spec in params.inputs.items()]
    return torch_runner(module, inputs, list(params.outputs),
                        f"transformers {transformers.__version__} {params.model_class}.forward (float32)")


def evaluation_inputs(context: VerifyContext[HfOnnxParams]) -> Inputs | None:
    """The held-out images, tensors and texts, as this graph takes them (``None`` without any)."""
    params = context.params
    held_out, said = _held_out(context)
    if not held_out:
        return None
    return Inputs(_feeds(params, held_out), " and ".join(said))


def image_feeds(context: VerifyContext[HfOnnxParams], images: list[Any]) -> list[dict[str, Any]]:
    """Images through the checkpoint's own image processor into ``pixel_values``."""
    from edgebuild.plugin import CheckpointError

    params = context.params
    pixels = params.inputs.get("pixel_values")
    if pixels is None or len(pixels.shape) != 4:
        raise CheckpointError(f"{context.name}: images go into a 'pixel_values' input of shape [batch, channels, height, "
                              f"width], and {params.model_class} takes {', '.join(params.inputs)}")
    return _feeds(params, image_inputs(params, context.checkpoint, images))
