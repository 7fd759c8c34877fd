"""Judging the ``.ort`` model: onnxruntime runs it, and the source ONNX graph, on the CPU on
the same seeded inputs, output by output."""

from __future__ import annotations

from typing import Any

from edgebuild.core.runner import Inputs, random_feeds, with_held_out
from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.plugin import OutputLimits, Runner, Verification, VerifyContext

from .params import DEFAULT_LIMITS, MODEL_FILE, SOURCE_MODEL, OrtFormatParams


def verify(context: VerifyContext[OrtFormatParams]) -> Verification:
    import torch

    from edgebuild.targets.runners import onnx_runner

    params = context.params
    ort_model = runner(context)
    graph = onnx_runner(context.source / SOURCE_MODEL)
    described = f"{params.verify.samples} random inputs (seed {params.verify.seed})"
    inputs = with_held_out(Inputs(random_feeds(ort_model.inputs, params.verify.samples, params.verify.seed), described),
                           context.held_out(), ort_model.inputs)
    comparisons: dict[str, list[dict[str, Any]]] = {name: [] for name in ort_model.outputs}
    for feed in inputs.feeds:
        expected, found = graph.run_one(feed), ort_model.run_one(feed)
        for name in ort_model.outputs:
            comparisons[name].append(agreement(torch.from_numpy(expected[name]).float()[None],
                                               torch.from_numpy(found[name]).float()[None]))
    note = f"{ort_model.description} vs {graph.description}, on {inputs.description}"
    checks = []
    measured = {}
    for name in ort_model.outputs:
        measured[name] = worst_agreement(comparisons[name])
        checks += output_checks(name, measured[name], params.verify.for_output(name, DEFAULT_LIMITS), note)
    return Verification(checks=checks, metrics={"outputs": measured, "level": "ran"})


def runner(context: VerifyContext[OrtFormatParams]) -> Runner:
    """The ``.ort`` model in onnxruntime, on the CPU."""
    from edgebuild.targets.runners import onnx_runner

    return onnx_runner(context.out_dir / MODEL_FILE)


def float_limits(params: OrtFormatParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS)
