"""Verifying the QDQ tower: onnxruntime CPU on the QDQ graph against the float32 tower
graph on the held-out inputs, and what every QDQ graph must hold (``edgebuild/ml/qdq.py``)."""

from __future__ import annotations

import json

from edgebuild.ml.compare import worst_case
from edgebuild.ml.qdq_checks import compare_graphs, graph_checks
from edgebuild.plugin import Check, Verification, VerifyContext

from ..qwen3_5_tower.params import GEOMETRY_FILE as SOURCE_GEOMETRY_FILE
from ..qwen3_5_tower.params import MODEL_FILE as SOURCE_MODEL_FILE
from .inputs import tower_inputs
from .params import MODEL_FILE, PATCHES_INPUT, QdqParams


def verify(context: VerifyContext) -> Verification:
    params = context.params
    assert isinstance(params, QdqParams)
    limits = params.limits()
    source = context.sources[params.source]
    (checkpoint,) = context.checkpoints.values()
    geometry = json.loads((source / SOURCE_GEOMETRY_FILE).read_text())["geometry"]
    float_model, qdq_model = source / SOURCE_MODEL_FILE, context.out_dir / MODEL_FILE

    label = "held_out" if not params.held_out.is_empty() else "calibration"
    inputs = params.held_out if label == "held_out" else params.calibration
    samples = tower_inputs(inputs, context.input_root, checkpoint, geometry, label)
    # The tower has one output, the merged tokens.
    comparisons = [outputs[0] for outputs in compare_graphs(float_model, qdq_model, [{PATCHES_INPUT: sample} for sample in samples])]
    measured = worst_case(comparisons)
    note = f"onnxruntime CPU, QDQ graph vs the float32 tower graph, {len(samples)} {label} inputs"
    graph, summary = graph_checks(float_model, qdq_model, params.options())
    checks = [
        Check.measure("cosine", measured["cosine"], ">=", limits["cosine_min"], note),
        Check.measure("mean_abs", measured["mean_abs"], "<=", limits["mean_abs"], note),
        Check.measure("max_abs", measured["max_abs"], "<=", limits["max_abs"], note),
        *graph,
    ]
    metrics = {
        "comparison": measured | {"reference": note, "samples": comparisons},
        "graph": summary,
    }
    return Verification(checks=checks, metrics=metrics)
