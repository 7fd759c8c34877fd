"""The coverage certificates of an ONNX graph, from static tables on this machine (the
format, ``formats.ONNX_GRAPH``, declares them):

- ``nnapi``, ``coreml``: onnxruntime's mobile usability checker
  (``onnxruntime.tools.mobile_helpers.usability_checker``): its static tables of what the
  NNAPI and Core ML (MLProgram) providers take, with its estimate of the partitions, on
  the graph as the checker counts it: after onnxruntime's basic optimizations (its own
  ``optimize_model``, what the device's onnxruntime applies before partitioning), with
  the count on the graph as built beside it (``as_built``). NNAPI runs 8-bit QDQ only: a
  QuantizeLinear or DequantizeLinear of 16-bit values falls back (an A16W8 graph);
- ``directml``: the static table of DML kernel registrations in
  :mod:`edgebuild.targets.directml_kernels`, with the ``Reshape allowzero=1`` rule,
  partitioned by the same estimate.

Nothing here runs a model: the optimization is onnxruntime's graph rewrite, written to a
temporary directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.ml.modules import _key, _modules, load_graph
from edgebuild.targets.coverage import Certificate, package_version
from edgebuild.targets.formats import MODEL_FILE


def _onnx_certificate(target: str, tool: str, tool_version: str, assumption: str, model: Any, info: Any,
                      as_built: Any = None, as_built_model: Any = None) -> Certificate:
    taken = {_key(node) for group in info.supported_groups for node in group}
    # The checker's groups hold nodes of the main graph and its subgraphs; fallbacks are
    # counted on the main graph, whose nodes are the ones it counts too.
    modules = _modules(model.graph) if as_built is None else _rewritten_modules(model.graph, as_built_model)
    fallbacks = [{"node": node.name or None, "op_type": node.op_type, "module": modules[_key(node)]}
                 for node in model.graph.node if _key(node) not in taken]
    built = None if as_built is None else {"nodes_total": int(as_built.num_nodes),
                                           "nodes_taken": int(as_built.num_supported_nodes),
                                           "partitions": int(as_built.num_partitions)}
    return Certificate(target=target, tool=tool, tool_version=tool_version, assumption=assumption,
                       nodes_total=int(info.num_nodes), nodes_taken=int(info.num_supported_nodes),
                       partitions=int(info.num_partitions), fallbacks=fallbacks, as_built=built)


def _rewritten_modules(graph: Any, built: Any) -> dict[Any, str | None]:
    """Each node's module in ``graph``, onnxruntime's rewrite of ``built`` (which drops the
    exporter's metadata): a node keeps its name, or is named after the node it was made
    from (``node_MatMul_19/MatMulAddFusion``, ``node_Reshape_52_new_reshape``), whose module
    it takes; else that of a neighbour that has one."""
    import re

    from edgebuild.ml.modules import modules_by_name

    before = modules_by_name(built.graph)

    def made_from(name: str) -> str | None:
        if name in before:
            return before[name]
        for cut in reversed([match.start() for match in re.finditer(r"[/_]", name)]):
            if name[:cut] in before:
                return before[name[:cut]]
        return None

    own = {_key(node): made_from(node.name) for node in graph.node}
    neighbours: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in [*node.input, *node.output]:
            neighbours.setdefault(name, []).append(node)
    return {key: module if module is not None else next(
        (own[_key(other)] for name in [*node.output, *node.input] for other in neighbours.get(name, [])
         if own[_key(other)] is not None), None)
        for node in graph.node for key, module in [(_key(node), own[_key(node)])]}


def _checker_table(name: str) -> Any:
    """The usability checker's supported-ops table ``name`` (it ships beside the checker)."""
    from onnxruntime.tools.mobile_helpers import usability_checker

    return usability_checker._SupportedOpsChecker(Path(usability_checker.__file__).parent / name)


class _EightBitQdqOnly:
    """NNAPI's table, and NNAPI's rule on quantized values: 8-bit only. A QuantizeLinear or
    DequantizeLinear of 16-bit values is not taken (the checker's table does not say)."""

    def __init__(self, table: Any, model: Any) -> None:
        self._table = table
        self._wide = sixteen_bit_qdq(model)

    def is_op_supported(self, node: Any) -> bool:
        return _key(node) not in self._wide and self._table.is_op_supported(node)


def sixteen_bit_qdq(model: Any) -> set[Any]:
    """The QuantizeLinear and DequantizeLinear nodes of ``model``'s main graph whose
    quantized side (a Q's output, a DQ's input) is 16-bit, by node key."""
    import onnx

    wide_types = {onnx.TensorProto.INT16, onnx.TensorProto.UINT16}
    graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type for value in [*graph.value_info, *graph.input, *graph.output]}
    types |= {tensor.name: tensor.data_type for tensor in graph.initializer}
    found = set()
    for node in graph.node:
        if node.op_type == "QuantizeLinear" and node.output:
            quantized = types.get(node.output[0])
            if quantized is None and len(node.input) > 2:
                quantized = types.get(node.input[2])
        elif node.op_type == "DequantizeLinear" and node.input:
            quantized = types.get(node.input[0])
        else:
            continue
        if quantized in wide_types:
            found.add(_key(node))
    return found


def nnapi_certificate(model: Any, as_built: Any = None) -> Certificate:
    """NNAPI through onnxruntime's usability checker (fixed input sizes required, as the
    provider does), 8-bit QDQ only; ``as_built``: the graph before optimization, counted
    beside."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_partitioning

    def count(graph: Any) -> Any:
        return check_partitioning(graph.graph, _EightBitQdqOnly(_checker_table("nnapi_supported_ops.md"), graph),
                                  require_fixed_input_sizes=True)

    return _onnx_certificate("nnapi", "onnxruntime usability_checker", package_version("onnxruntime"),
                             "NNAPI, onnxruntime's static table (nnapi_supported_ops.md), after onnxruntime's basic "
                             "optimizations as the checker counts; QDQ of 16-bit values not taken (NNAPI runs 8-bit "
                             "QDQ only); per-op caveats unchecked", model, count(model),
                             count(as_built) if as_built is not None else None, as_built)


def coreml_certificate(model: Any, as_built: Any = None) -> Certificate:
    """Core ML (MLProgram) through onnxruntime's usability checker; ``as_built``: the graph
    before optimization, counted beside."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_coreml_partitions

    def count(graph: Any) -> Any:
        return check_coreml_partitions(graph, True, "coreml_supported_mlprogram_ops.md")

    return _onnx_certificate("coreml", "onnxruntime usability_checker", package_version("onnxruntime"),
                             "Core ML MLProgram, onnxruntime's static table (coreml_supported_mlprogram_ops.md), "
                             "rank <= 5, after onnxruntime's basic optimizations as the checker counts; per-op "
                             "caveats unchecked", model, count(model),
                             count(as_built) if as_built is not None else None, as_built)


class _DirectmlTable:
    """A supported-ops checker for the usability checker's partitioning: the DML table."""

    def __init__(self, opsets: dict[str, int]) -> None:
        self._opsets = opsets

    def is_op_supported(self, node: Any) -> bool:
        return directml_takes(node, self._opsets)


def directml_takes(node: Any, opsets: dict[str, int]) -> bool:
    """Whether the DML provider has a kernel for ``node`` in a model of these opsets
    (domain -> version), and takes it."""
    import onnx.defs

    from edgebuild.targets.directml_kernels import MICROSOFT_KERNELS, ONNX_KERNELS

    domain = node.domain or ""
    if domain == "com.microsoft":
        return node.op_type in MICROSOFT_KERNELS
    if domain not in ("", "ai.onnx"):
        return False
    span = ONNX_KERNELS.get(node.op_type)
    if span is None:
        return False
    try:
        since = onnx.defs.get_schema(node.op_type, opsets.get("", opsets.get("ai.onnx", 1)), "").since_version
    except onnx.defs.SchemaError:
        return False
    if not span[0] <= since <= span[1]:
        return False
    if node.op_type == "Reshape":
        allowzero = next((attribute.i for attribute in node.attribute if attribute.name == "allowzero"), 0)
        if allowzero:
            return False
    return True


def directml_certificate(model: Any) -> Certificate:
    """DirectML from the package's static table of DML kernel registrations."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_partitioning

    from edgebuild.targets.directml_kernels import SOURCE

    opsets = {entry.domain: entry.version for entry in model.opset_import}
    info = check_partitioning(model.graph, _DirectmlTable(opsets), require_fixed_input_sizes=False)  # type: ignore[arg-type]
    return _onnx_certificate("directml", "edgebuild directml_kernels", SOURCE,
                             "DirectML, static table of onnxruntime's DML kernel registrations by operator and "
                             "opset, plus Reshape allowzero=1 refused; types and feature levels unchecked",
                             model, info)


def _graph(directory: Path, memo: dict[str, Any]) -> Any:
    """The graph in ``directory``, read once for the three certificates (``memo``)."""
    if MODEL_FILE not in memo:
        memo[MODEL_FILE] = load_graph(directory / MODEL_FILE)
    return memo[MODEL_FILE]


OPTIMIZED = "optimized:" + MODEL_FILE


def _optimized_graph(directory: Path, memo: dict[str, Any]) -> Any:
    """The graph in ``directory`` after onnxruntime's basic optimizations, as the usability
    checker counts it (its own ``optimize_model``, into a temporary directory), read once."""
    if OPTIMIZED not in memo:
        import tempfile

        from onnxruntime.tools.onnx_model_utils import optimize_model

        with tempfile.TemporaryDirectory(prefix="edgebuild-optimized-") as scratch:
            optimized = Path(scratch) / MODEL_FILE
            optimize_model(directory / MODEL_FILE, optimized, use_external_initializers=True)
            memo[OPTIMIZED] = load_graph(optimized)
    return memo[OPTIMIZED]


def nnapi(directory: Path, memo: dict[str, Any]) -> Certificate:
    return nnapi_certificate(_optimized_graph(directory, memo), _graph(directory, memo))


def coreml(directory: Path, memo: dict[str, Any]) -> Certificate:
    return coreml_certificate(_optimized_graph(directory, memo), _graph(directory, memo))


def directml(directory: Path, memo: dict[str, Any]) -> Certificate:
    return directml_certificate(_graph(directory, memo))
