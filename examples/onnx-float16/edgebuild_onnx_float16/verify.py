"""Judging the float16 graph: onnxruntime's CPU provider on it and on its float32 source,
on the same seeded inputs, output by output (cosine, and the largest error relative to
the output's scale). Against the float model at the root of its chain, the engine judges
it too (``vs_float``), and computes its coverage certificates."""

from __future__ import annotations

from edgebuild.plugin import Check, OutputLimits, TensorSpec, Verification, VerifyContext, random_feeds

from . import MODEL_FILE, Float16Params


def verify(context: VerifyContext[Float16Params]) -> Verification:
    import numpy
    import onnxruntime

    params = context.params

    def session(path) -> onnxruntime.InferenceSession:
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    converted, source = session(context.out_dir / MODEL_FILE), session(context.source / MODEL_FILE)
    types = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64", "tensor(bool)": "bool"}
    specs = [TensorSpec(item.name, tuple(dim if isinstance(dim, int) else None for dim in item.shape),
                        types.get(item.type, "float32")) for item in source.get_inputs()]
    feeds = random_feeds(specs, params.verify.samples, params.verify.seed)
    names = [item.name for item in source.get_outputs()]
    # Without keep_io_types the converted graph takes float16 where its source takes float32.
    halves = {item.name for item in converted.get_inputs() if item.type == "tensor(float16)"}
    worst: dict[str, dict[str, float]] = {}
    for feed in feeds:
        expected = source.run(names, feed)
        found = converted.run(names, {name: value.astype("float16") if name in halves else value
                                      for name, value in feed.items()})
        for name, want, got in zip(names, expected, found):
            want, got = numpy.asarray(want, numpy.float64).ravel(), numpy.asarray(got, numpy.float64).ravel()
            cosine = float(want @ got / (numpy.linalg.norm(want) * numpy.linalg.norm(got) or 1.0))
            relative = float(numpy.abs(got - want).max() / (numpy.abs(want).max() or 1.0))
            seen = worst.setdefault(name, {"cosine": 1.0, "max_rel": 0.0})
            seen["cosine"], seen["max_rel"] = min(seen["cosine"], cosine), max(seen["max_rel"], relative)
    note = f"onnxruntime CPU, the float16 graph vs its float32 source, {len(feeds)} random inputs"
    checks = []
    for name, measured in worst.items():
        checks += [Check.measure(f"{name}.cosine", round(measured["cosine"], 8), ">=", params.verify.cosine_min, note),
                   Check.measure(f"{name}.max_rel", measured["max_rel"], "<=", params.verify.max_rel, note)]
    return Verification(checks=checks, metrics={"outputs": worst})


def float_limits(params: Float16Params, output: str) -> OutputLimits:
    """Against the float model of the chain: what it holds against its float32 source."""
    return params.limits()
