"""Judging the QDQ graph: onnxruntime CPU on it against the float source graph, output by
output, on the held-out inputs (else the calibration inputs); and what every QDQ graph
must hold. (Against the float model at the root of its chain, on the same inputs, the
engine judges it too: ``edgebuild/run/chain.py``.)"""

from __future__ import annotations

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.ml.agreement import output_checks, worst_agreement
from edgebuild.ml.qdq_checks import compare_graphs, graph_checks
from edgebuild.models.graph_inputs import graph_feeds
from edgebuild.plugin import Inputs, OutputLimits, Verification, VerifyContext

from .params import MODEL_FILE, SIGNATURE_FILE, OnnxQdqParams, source_signature


def verify(context: VerifyContext[OnnxQdqParams]) -> Verification:
    params = context.params
    source = context.source
    export = read_json(source / SIGNATURE_FILE, RECORD_BYTES)
    float_model, qdq_model = source / MODEL_FILE, context.out_dir / MODEL_FILE
    inputs = evaluation_inputs(context)
    per_sample = compare_graphs(float_model, qdq_model, inputs.feeds)
    note = f"onnxruntime CPU, QDQ graph vs the float graph, {inputs.description}"
    checks = []
    measured = {}
    for position, name in enumerate(spec["name"] for spec in export["outputs"]):
        measured[name] = worst_agreement([outputs[position] for outputs in per_sample])
        checks += output_checks(name, measured[name], params.limits(name), note)
    graph, summary = graph_checks(float_model, qdq_model, params.options())
    return Verification(checks=[*checks, *graph], metrics={"outputs": measured, "reference": note, "graph": summary})


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def evaluation_inputs(context: VerifyContext[OnnxQdqParams]) -> Inputs:
    """The held-out inputs (else the calibration inputs), as the graph takes them."""
    params = context.params
    (checkpoint,) = context.checkpoints.values()
    signature = source_signature(context.source)
    label = "held_out" if not params.held_out.is_empty() else "calibration"
    feeds = graph_feeds(params.held_out if label == "held_out" else params.calibration, context.input_root, checkpoint,
                        signature, label)
    return Inputs(feeds, f"{len(feeds)} {label} inputs")


def float_limits(params: OnnxQdqParams, output: str) -> OutputLimits:
    """Against the float model of the chain: the limits against the float graph (which
    agrees with the float model to about 1e-6), the manifest's included."""
    return params.limits(output)
