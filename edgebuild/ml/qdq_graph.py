"""What a QDQ graph holds, read from the graph alone (never its weights' values): its
Q/DQ nodes and their domains, which weights are quantized and to what type, the
activation types, and every float tensor a computing node still reads, with why.

Build writes this into the sidecar; verification recomputes it from the built graph
and checks it against the parameters.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# Where an op keeps its weight, and its bias (input indices). A float initializer in a
# weight slot of a quantizable op is a weight the quantizer left float.
WEIGHT_INPUTS = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1, "LayerNormalization": 1, "InstanceNormalization": 1}
BIAS_INPUTS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2, "LayerNormalization": 2, "InstanceNormalization": 2}
STANDARD_DOMAINS = ("", "ai.onnx")
# Ops that only move data: the quantizer gives their output the input's scale and
# places the QuantizeLinear after them.
DATA_MOVEMENT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split", "Gather"})


def _type_name(data_type: int) -> str:
    import onnx

    return onnx.TensorProto.DataType.Name(data_type).lower()


def qdq_summary(model_path: Path, quantizable_ops: set[str]) -> dict[str, Any]:
    """The graph's quantization, as counts and names (see the module docstring)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    initializers = {item.name: item for item in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}
    elem_types = {value.name: value.type.tensor_type.elem_type for value in [*graph.value_info, *graph.input, *graph.output]}
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}

    qdq_nodes: Counter[str] = Counter()
    qdq_domains: set[str] = set()
    activation_types: Counter[str] = Counter()
    for node in graph.node:
        if node.op_type in QDQ_OPS:
            qdq_nodes[node.op_type] += 1
            qdq_domains.add(node.domain or "ai.onnx")
        if node.op_type == "QuantizeLinear":
            zero_point = initializers.get(node.input[2]) if len(node.input) > 2 else None
            # Without a zero point QuantizeLinear produces uint8.
            activation_types[_type_name(zero_point.data_type) if zero_point is not None else "uint8"] += 1

    def dequantized_initializer(tensor: str) -> Any:
        node = producers.get(tensor)
        if node is not None and node.op_type == "DequantizeLinear" and node.input[0] in initializers:
            return initializers[node.input[0]]
        return None

    ops: Counter[str] = Counter()
    quantized_ops: Counter[str] = Counter()
    weight_types: Counter[str] = Counter()
    weights_by_op: Counter[str] = Counter()
    bias_types: Counter[str] = Counter()
    constant_types: Counter[str] = Counter()
    unquantized_weights: list[str] = []
    left_float: list[dict[str, Any]] = []
    integer_inputs = 0
    for node in graph.node:
        if node.op_type in QDQ_OPS:
            continue
        ops[node.op_type] += 1
        float_inputs = all_dequantized = 0
        for index, tensor in enumerate(node.input):
            if not tensor:
                continue
            stored = dequantized_initializer(tensor)
            if stored is not None:
                float_inputs += 1
                all_dequantized += 1
                kind = _type_name(stored.data_type)
                if WEIGHT_INPUTS.get(node.op_type) == index:
                    weight_types[kind] += 1
                    weights_by_op[node.op_type] += 1
                elif BIAS_INPUTS.get(node.op_type) == index:
                    bias_types[kind] += 1
                else:
                    constant_types[kind] += 1
                continue
            producer = producers.get(tensor)
            if producer is not None and producer.op_type == "DequantizeLinear":
                float_inputs += 1
                all_dequantized += 1
                continue
            data_type = initializers[tensor].data_type if tensor in initializers else elem_types.get(tensor)
            if data_type not in float_types:
                integer_inputs += 1
                continue
            float_inputs += 1
            left_float.append({"tensor": tensor, "consumer": node.op_type, "input": index,
                               "reason": _why_float(node.op_type, index, tensor, initializers, producers, quantizable_ops)})
            if tensor in initializers and WEIGHT_INPUTS.get(node.op_type) == index and node.op_type in quantizable_ops:
                unquantized_weights.append(tensor)
        if float_inputs and all_dequantized == float_inputs:
            quantized_ops[node.op_type] += 1

    opset = next((entry.version for entry in model.opset_import if entry.domain in STANDARD_DOMAINS), None)
    return {
        "opset": opset,
        "qdq_nodes": {op: qdq_nodes[op] for op in QDQ_OPS},
        "qdq_domains": sorted(qdq_domains),
        "ops": dict(sorted(ops.items())),
        "quantized_ops": dict(sorted(quantized_ops.items())),
        "activation_types": dict(sorted(activation_types.items())),
        "quantized_weights": {"count": sum(weight_types.values()), "types": dict(sorted(weight_types.items())),
                              "by_op": dict(sorted(weights_by_op.items()))},
        "quantized_biases": dict(sorted(bias_types.items())),
        "quantized_constants": dict(sorted(constant_types.items())),
        "unquantized_weights": sorted(unquantized_weights),
        "integer_inputs": integer_inputs,
        "left_float": sorted(left_float, key=lambda item: (item["tensor"], item["consumer"], item["input"])),
    }


def _why_float(op_type: str, index: int, tensor: str, initializers: dict[str, Any], producers: dict[str, Any],
               quantizable_ops: set[str]) -> str:
    if tensor not in initializers and tensor not in producers:
        if op_type in DATA_MOVEMENT_OPS:
            return f"graph input: the graph's interface is float; {op_type} only moves data, so the QuantizeLinear follows it"
        return f"graph input read by {op_type} before any QuantizeLinear"
    if op_type not in quantizable_ops:
        return f"{op_type} is not among the op types the configuration quantizes"
    if tensor in initializers:
        return f"constant input {index} of {op_type}, which the quantizer left float"
    return f"input {index} of {op_type}, not calibrated"
