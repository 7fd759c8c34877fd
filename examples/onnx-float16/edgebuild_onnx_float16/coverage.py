"""The ``float16`` certificate: which nodes of the converted graph compute in float16.

A node that reads or writes a float tensor computes in float16 when every float tensor it
touches is float16; it "falls back" when one of them is float32 (the converter kept it
there: an op of its block list, or one it cannot take). The converter's own Casts, and
nodes that touch no float tensor (shape arithmetic), are not counted. Partitions are the
connected groups of float16 nodes, by onnxruntime's own partitioning
(``usability_checker.check_partitioning``), as for the ONNX graph's other certificates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import Certificate

MODEL_FILE = "model.onnx"
_FLOAT, _FLOAT16 = 1, 10


def _float_types(model: Any) -> dict[str, int]:
    """Every tensor of the graph's main body -> its element type, as the graph says it (the
    converter writes every tensor's type it changed; inferring them again would disagree
    with the Casts around what it kept)."""
    graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type for value in (*graph.input, *graph.output, *graph.value_info)}
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    return types


def _precision(node: Any, types: dict[str, int]) -> str | None:
    """``"float16"``, ``"float32"``, or ``None`` for a node the certificate does not count."""
    if node.op_type == "Cast":
        return None
    floats = [types[name] for name in (*node.input, *node.output) if name and types.get(name) in (_FLOAT, _FLOAT16)]
    if not floats:
        return None
    return "float32" if _FLOAT in floats else "float16"


def float32_nodes(model: Any) -> list[Any]:
    """The counted nodes that compute in float32."""
    types = _float_types(model)
    return [node for node in model.graph.node if _precision(node, types) == "float32"]


class _Float16Nodes:
    """A supported-ops checker for onnxruntime's partitioning: the nodes that compute in float16."""

    def __init__(self, types: dict[str, int]) -> None:
        self._types = types

    def is_op_supported(self, node: Any) -> bool:
        return _precision(node, self._types) != "float32"


def float16(directory: Path, memo: dict[str, Any]) -> Certificate:
    import onnx
    import onnxruntime
    from onnxruntime.tools.mobile_helpers.usability_checker import check_partitioning

    model = onnx.load(str(directory / MODEL_FILE), load_external_data=False)
    types = _float_types(model)
    counted = [node for node in model.graph.node if _precision(node, types) is not None]
    fallbacks = [{"node": node.name or None, "op_type": node.op_type, "module": None}
                 for node in counted if _precision(node, types) == "float32"]
    info = check_partitioning(model.graph, _Float16Nodes(types), require_fixed_input_sizes=False)
    return Certificate(
        target="float16", tool="onnxruntime.transformers.float16 (the graph's tensor types)",
        tool_version=onnxruntime.__version__,
        assumption="a node computes in float16 when every float tensor it reads or writes is float16; Casts and "
                   "nodes on no float tensor are not counted",
        nodes_total=len(counted), nodes_taken=len(counted) - len(fallbacks), partitions=int(info.num_partitions),
        fallbacks=fallbacks,
    )
