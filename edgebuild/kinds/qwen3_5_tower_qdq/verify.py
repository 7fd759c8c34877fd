"""Verifying the QDQ tower: onnxruntime CPU on the QDQ graph against the float32 tower
graph on the held-out inputs, and what the graph holds: standard-domain Q/DQ at the
right opset, every weight of a quantizable op quantized, the expected types."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.compare import compare_outputs, worst_case
from edgebuild.plugin import Check, Verification, VerifyContext
from ..qwen3_5_tower.params import GEOMETRY_FILE as SOURCE_GEOMETRY_FILE
from ..qwen3_5_tower.params import MODEL_FILE as SOURCE_MODEL_FILE
from .graph import WEIGHT_INPUTS, qdq_summary
from .inputs import tower_inputs
from .params import MODEL_FILE, PATCHES_INPUT, SIXTEEN_BIT_OPSET, SIXTEEN_BIT_TYPES, QdqParams
from .qdq import qnn_config


def verify(context: VerifyContext) -> Verification:
    import torch

    from edgebuild.ml.onnx_tools import run_session

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
    feeds = [{PATCHES_INPUT: sample} for sample in samples]
    # One session at a time: the float graph and the QDQ graph never both in memory.
    quantized = [outputs[0] for outputs in run_session(qdq_model, feeds)]
    reference = [outputs[0] for outputs in run_session(float_model, feeds)]
    comparisons = [compare_outputs(torch.from_numpy(ref)[None], torch.from_numpy(out)[None]) for ref, out in zip(reference, quantized)]
    measured = worst_case(comparisons)
    note = f"onnxruntime CPU, QDQ graph vs the float32 tower graph, {len(samples)} {label} inputs"

    quantizable = set(qnn_config(float_model, [], PATCHES_INPUT, params.activation_type, params.weight_type,
                                 params.per_channel, params.calibration_method).op_types_to_quantize)
    summary = qdq_summary(qdq_model, quantizable)
    expected_weights = _weights_of_quantizable_ops(float_model, quantizable)
    sixteen_bit = {params.activation_type, params.weight_type} & SIXTEEN_BIT_TYPES
    source_opset = _opset(float_model)
    checks = [
        Check.measure("cosine", measured["cosine"], ">=", limits["cosine_min"], note),
        Check.measure("mean_abs", measured["mean_abs"], "<=", limits["mean_abs"], note),
        Check.measure("max_abs", measured["max_abs"], "<=", limits["max_abs"], note),
        Check.measure("qdq_domains", summary["qdq_domains"], "==", ["ai.onnx"],
                      f"{summary['qdq_nodes']['QuantizeLinear']} QuantizeLinear, {summary['qdq_nodes']['DequantizeLinear']} DequantizeLinear"),
        Check.measure("opset", summary["opset"], ">=" if sixteen_bit else "==", SIXTEEN_BIT_OPSET if sixteen_bit else source_opset,
                      "16-bit Q/DQ are ai.onnx ops from opset 21" if sixteen_bit else "the source's opset, unchanged"),
        Check.measure("quantized_weights", summary["quantized_weights"]["count"], "==", expected_weights,
                      "weights (Conv/Gemm/MatMul/LayerNormalization initializers) of quantizable ops, all behind a DequantizeLinear"),
        Check.measure("unquantized_weights", len(summary["unquantized_weights"]), "==", 0,
                      ", ".join(summary["unquantized_weights"][:5]) or "none"),
        Check.measure("weight_types", sorted(summary["quantized_weights"]["types"]), "==", [params.weight_type]),
        Check.measure("activation_types", sorted(summary["activation_types"]), "==", [params.activation_type],
                      "zero-point types of every QuantizeLinear"),
    ]
    metrics = {
        "comparison": measured | {"reference": note, "samples": comparisons},
        "graph": summary,
    }
    return Verification(checks=checks, metrics=metrics)


def _opset(model_path: Any) -> int | None:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def _weights_of_quantizable_ops(model_path: Any, quantizable: set[str]) -> int:
    """Weight inputs (initializers) of the quantizable ops in the float graph."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    initializers = {item.name for item in model.graph.initializer}
    return sum(
        1
        for node in model.graph.node
        if node.op_type in quantizable
        and WEIGHT_INPUTS.get(node.op_type) is not None
        and len(node.input) > WEIGHT_INPUTS[node.op_type]
        and node.input[WEIGHT_INPUTS[node.op_type]] in initializers
    )
