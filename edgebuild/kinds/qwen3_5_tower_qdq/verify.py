"""Verifying the QDQ tower: onnxruntime CPU on the QDQ graph against the float32 tower
graph on the held-out inputs, and what every QDQ graph must hold (``edgebuild/ml/qdq.py``)."""

from __future__ import annotations

import json

from edgebuild.ml.compare import worst_case
from edgebuild.ml.qdq_checks import compare_graphs, graph_checks
from edgebuild.models.qwen3_5.geometry import GEOMETRY_FILE
from edgebuild.models.qwen3_5.geometry import MODEL_FILE as SOURCE_MODEL_FILE
from edgebuild.models.qwen3_5.inputs import PATCHES_INPUT, tower_inputs
from edgebuild.plugin import Check, Inputs, OutputLimits, Verification, VerifyContext

from .params import MODEL_FILE, QdqParams


def verify(context: VerifyContext[QdqParams]) -> Verification:
    params = context.params
    limits = params.limits()
    source = context.source
    float_model, qdq_model = source / SOURCE_MODEL_FILE, context.out_dir / MODEL_FILE

    inputs = evaluation_inputs(context)
    # The tower has one output, the merged tokens.
    comparisons = [outputs[0] for outputs in compare_graphs(float_model, qdq_model, inputs.feeds)]
    measured = worst_case(comparisons)
    note = f"onnxruntime CPU, QDQ graph vs the float32 tower graph, {inputs.description}"
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


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def evaluation_inputs(context: VerifyContext[QdqParams]) -> Inputs:
    """The held-out inputs (else the calibration inputs), as the tower's patches."""
    params = context.params
    source = context.source
    (checkpoint,) = context.checkpoints.values()
    geometry = json.loads((source / GEOMETRY_FILE).read_text())["geometry"]
    label = "held_out" if not params.held_out.is_empty() else "calibration"
    samples = tower_inputs(params.held_out if label == "held_out" else params.calibration, context.input_root,
                           checkpoint, geometry, label)
    return Inputs([{PATCHES_INPUT: sample} for sample in samples], f"{len(samples)} {label} inputs")


def float_limits(params: QdqParams, output: str) -> OutputLimits:
    """Against the float model of the chain: the limits against the float graph (which
    agrees with the float model to about 1e-5), the manifest's included."""
    return OutputLimits(**params.limits())
