"""What every QDQ graph is checked for, and how it compares with its float graph: the
verification half of ``qdq.py`` (apart, so that the code a QDQ build's fingerprint
covers is the quantizer's, not the checks')."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.ml.qdq import SIXTEEN_BIT_OPSET, SIXTEEN_BIT_TYPES, Feeds, QdqOptions, quant_config

if TYPE_CHECKING:
    from edgebuild.core.report import Check


def graph_checks(float_model: Path, qdq_model: Path, options: QdqOptions) -> tuple[list["Check"], dict[str, Any]]:
    """What every QDQ graph must hold, from the graph alone: standard-domain Q/DQ at the
    right opset, every weight of a quantizable op quantized, the expected types. Returns
    the checks and the graph's summary."""
    import onnx

    from edgebuild.core.report import Check
    from edgebuild.ml.qdq_graph import WEIGHT_INPUTS, qdq_summary

    quantizable = set(quant_config(float_model, [], options).op_types_to_quantize)
    summary = qdq_summary(qdq_model, quantizable)
    model = onnx.load(str(float_model), load_external_data=False)
    initializers = {item.name for item in model.graph.initializer}
    expected_weights = sum(
        1
        for node in model.graph.node
        if node.op_type in quantizable
        and WEIGHT_INPUTS.get(node.op_type) is not None
        and len(node.input) > WEIGHT_INPUTS[node.op_type]
        and node.input[WEIGHT_INPUTS[node.op_type]] in initializers
    )
    source_opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)
    sixteen_bit = {options.activation_type, options.weight_type} & SIXTEEN_BIT_TYPES
    checks = [
        Check.measure("qdq_domains", summary["qdq_domains"], "==", ["ai.onnx"],
                      f"{summary['qdq_nodes']['QuantizeLinear']} QuantizeLinear, {summary['qdq_nodes']['DequantizeLinear']} DequantizeLinear"),
        Check.measure("opset", summary["opset"], ">=" if sixteen_bit else "==", SIXTEEN_BIT_OPSET if sixteen_bit else source_opset,
                      "16-bit Q/DQ are ai.onnx ops from opset 21" if sixteen_bit else "the source's opset, unchanged"),
        Check.measure("quantized_weights", summary["quantized_weights"]["count"], "==", expected_weights,
                      "weights (Conv/Gemm/MatMul/LayerNormalization initializers) of quantizable ops, all behind a DequantizeLinear"),
        Check.measure("unquantized_weights", len(summary["unquantized_weights"]), "==", 0,
                      ", ".join(summary["unquantized_weights"][:5]) or "none"),
        Check.measure("weight_types", sorted(summary["quantized_weights"]["types"]), "==", [options.weight_type]),
        Check.measure("activation_types", sorted(summary["activation_types"]), "==", [options.activation_type],
                      "zero-point types of every QuantizeLinear"),
    ]
    return checks, summary


def compare_graphs(float_model: Path, qdq_model: Path, feeds: list[Feeds]) -> list[list[dict[str, Any]]]:
    """Per sample, per output: the QDQ graph's output against the float graph's, both on
    onnxruntime's CPU provider (one session at a time: the two graphs are never both in
    memory)."""
    import torch

    from edgebuild.ml.agreement import agreement
    from edgebuild.ml.onnx_tools import run_session

    quantized = run_session(qdq_model, feeds)
    reference = run_session(float_model, feeds)
    return [
        [agreement(torch.from_numpy(expected).float()[None], torch.from_numpy(actual).float()[None])
         for expected, actual in zip(reference_outputs, quantized_outputs)]
        for reference_outputs, quantized_outputs in zip(reference, quantized)
    ]
