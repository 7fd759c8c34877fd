"""Judging the QDQ graph: onnxruntime CPU on it against the float source graph, output by
output, on the held-out inputs (else the calibration inputs); and what every QDQ graph
must hold."""

from __future__ import annotations

import json

from edgebuild.ml.compare import worst_case
from edgebuild.ml.qdq_checks import compare_graphs, graph_checks
from edgebuild.plugin import Check, Verification, VerifyContext

from .inputs import graph_feeds
from .params import MODEL_FILE, SOURCE_INFO_FILE, OnnxQdqParams


def verify(context: VerifyContext) -> Verification:
    params = context.params
    assert isinstance(params, OnnxQdqParams)
    source = context.sources[params.source]
    (checkpoint,) = context.checkpoints.values()
    export = json.loads((source / SOURCE_INFO_FILE).read_text())
    float_model, qdq_model = source / MODEL_FILE, context.out_dir / MODEL_FILE
    label = "held_out" if not params.held_out.is_empty() else "calibration"
    signature = {spec["name"]: spec for spec in export["inputs"]}
    feeds = graph_feeds(params.held_out if label == "held_out" else params.calibration, context.input_root, checkpoint,
                        signature, label)
    per_sample = compare_graphs(float_model, qdq_model, feeds)
    limits = params.limits()
    note = f"onnxruntime CPU, QDQ graph vs the float graph, {len(feeds)} {label} inputs"
    checks = []
    measured = {}
    for position, name in enumerate(spec["name"] for spec in export["outputs"]):
        worst = worst_case([outputs[position] for outputs in per_sample])
        measured[name] = worst
        checks.append(Check.measure(f"{name}.cosine", worst["cosine"], ">=", limits["cosine_min"], note))
        for key in ("mean_abs", "max_abs"):
            if limits[key] is not None:
                checks.append(Check.measure(f"{name}.{key}", worst[key], "<=", limits[key], note))
    graph, summary = graph_checks(float_model, qdq_model, params.options())
    return Verification(checks=[*checks, *graph], metrics={"outputs": measured, "reference": note, "graph": summary})
