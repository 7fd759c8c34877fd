"""Judging the ``.ort`` model: onnxruntime runs it, and the source ONNX graph, on the CPU on
the same seeded inputs, output by output."""

from __future__ import annotations

from typing import Any

from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.plugin import OutputLimits, Runner, Verification, VerifyContext

from .params import DEFAULT_LIMITS, MODEL_FILE, SOURCE_MODEL, OrtFormatParams


def verify(context: VerifyContext) -> Verification:
    import numpy
    import torch

    from edgebuild.ml.runners import onnx_runner

    params = context.params
    assert isinstance(params, OrtFormatParams)
    ort_model = runner(context)
    graph = onnx_runner(context.sources[params.source] / SOURCE_MODEL)
    generator = numpy.random.default_rng(params.verify.seed)
    feeds = []
    for _ in range(params.verify.samples):
        feeds.append({spec.name: generator.standard_normal(spec.shape).astype(spec.dtype) if spec.dtype.startswith("float")
                      else numpy.ones(spec.shape, dtype=spec.dtype) if spec.name.endswith("_mask")
                      else numpy.zeros(spec.shape, dtype=spec.dtype) for spec in ort_model.inputs})
    comparisons: dict[str, list[dict[str, Any]]] = {name: [] for name in ort_model.outputs}
    for feed in feeds:
        expected, found = graph.run_one(feed), ort_model.run_one(feed)
        for name in ort_model.outputs:
            comparisons[name].append(agreement(torch.from_numpy(expected[name]).float()[None],
                                               torch.from_numpy(found[name]).float()[None]))
    note = f"{ort_model.description} vs {graph.description}, {params.verify.samples} random inputs"
    checks = []
    measured = {}
    for name in ort_model.outputs:
        measured[name] = worst_agreement(comparisons[name])
        checks += output_checks(name, measured[name], params.verify.for_output(name, DEFAULT_LIMITS), note)
    return Verification(checks=checks, metrics={"outputs": measured, "level": "ran"})


def runner(context: VerifyContext) -> Runner:
    """The ``.ort`` model in onnxruntime, on the CPU."""
    from edgebuild.ml.runners import onnx_runner

    return onnx_runner(context.out_dir / MODEL_FILE)


def float_limits(params: OrtFormatParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS)
