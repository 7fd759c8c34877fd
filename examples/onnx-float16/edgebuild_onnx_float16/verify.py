"""Judging the float16 graph: onnxruntime's CPU provider on it and on its float32 source,
on the same seeded inputs, output by output (cosine, and the largest error relative to
the output's scale), as edgebuild judges its own targets (``agreement``,
``output_checks``). Against the float model at the root of its chain, the engine judges
it too (``vs_float``), and computes its coverage certificates."""

from __future__ import annotations

from edgebuild.plugin import (OutputLimits, Verification, VerifyContext, agreement, onnx_runner, output_checks,
                              random_feeds, worst_agreement)

from . import MODEL_FILE, Float16Params


def verify(context: VerifyContext[Float16Params]) -> Verification:
    import torch

    params = context.params
    converted, source = onnx_runner(context.out_dir / MODEL_FILE), onnx_runner(context.source / MODEL_FILE)
    feeds = random_feeds(source.inputs, params.verify.samples, params.verify.seed)
    # Without keep_io_types the converted graph takes float16 where its source takes float32.
    halves = {spec.name for spec in converted.inputs if spec.dtype == "float16"}
    comparisons: dict[str, list[dict]] = {name: [] for name in source.outputs}
    for feed in feeds:
        expected = source.run_one(feed)
        found = converted.run_one({name: value.astype("float16") if name in halves else value
                                   for name, value in feed.items()})
        for name in source.outputs:
            comparisons[name].append(agreement(torch.from_numpy(expected[name]).double()[None],
                                               torch.from_numpy(found[name]).double()[None]))
    note = f"onnxruntime CPU, the float16 graph vs its float32 source, {len(feeds)} random inputs"
    limits = params.limits()
    checks, worst = [], {}
    for name, measured in comparisons.items():
        worst[name] = worst_agreement(measured)
        checks += output_checks(name, worst[name], limits, note)
    return Verification(checks=checks, metrics={"outputs": worst})


def float_limits(params: Float16Params, output: str) -> OutputLimits:
    """Against the float model of the chain: what it holds against its float32 source."""
    return params.limits()
