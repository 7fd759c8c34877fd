"""The coverage certificates of an ONNX graph, from static tables on this machine (the
format, ``formats.ONNX_GRAPH``, declares them):

- ``nnapi``, ``coreml``: onnxruntime's mobile usability checker
  (``onnxruntime.tools.mobile_helpers.usability_checker``): its static tables of what the
  NNAPI and Core ML (MLProgram) providers take, with its estimate of the partitions;
- ``directml``: the static table of DML kernel registrations in
  :mod:`edgebuild.targets.directml_kernels`, with the ``Reshape allowzero=1`` rule,
  partitioned by the same estimate.

Pure functions of the graph: nothing here runs a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.ml.modules import _key, _modules, load_graph
from edgebuild.targets.coverage import Certificate, package_version
from edgebuild.targets.formats import MODEL_FILE


def _onnx_certificate(target: str, tool: str, tool_version: str, assumption: str, model: Any, info: Any) -> Certificate:
    taken = {_key(node) for group in info.supported_groups for node in group}
    # The checker's groups hold nodes of the main graph and its subgraphs; fallbacks are
    # counted on the main graph, whose nodes are the ones it counts too.
    modules = _modules(model.graph)
    fallbacks = [{"node": node.name or None, "op_type": node.op_type, "module": modules[_key(node)]}
                 for node in model.graph.node if _key(node) not in taken]
    return Certificate(target=target, tool=tool, tool_version=tool_version, assumption=assumption,
                       nodes_total=int(info.num_nodes), nodes_taken=int(info.num_supported_nodes),
                       partitions=int(info.num_partitions), fallbacks=fallbacks)


def nnapi_certificate(model: Any) -> Certificate:
    """NNAPI through onnxruntime's usability checker (fixed input sizes required, as the
    provider does)."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_nnapi_partitions

    info = check_nnapi_partitions(model, require_fixed_input_sizes=True)
    return _onnx_certificate("nnapi", "onnxruntime usability_checker", package_version("onnxruntime"),
                             "NNAPI, onnxruntime's static table (nnapi_supported_ops.md); the graph as built, "
                             "before onnxruntime's optimizations; per-op caveats unchecked", model, info)


def coreml_certificate(model: Any) -> Certificate:
    """Core ML (MLProgram) through onnxruntime's usability checker."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_coreml_partitions

    info = check_coreml_partitions(model, True, "coreml_supported_mlprogram_ops.md")
    return _onnx_certificate("coreml", "onnxruntime usability_checker", package_version("onnxruntime"),
                             "Core ML MLProgram, onnxruntime's static table (coreml_supported_mlprogram_ops.md), "
                             "rank <= 5; the graph as built; per-op caveats unchecked", model, info)


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


def nnapi(directory: Path, memo: dict[str, Any]) -> Certificate:
    return nnapi_certificate(_graph(directory, memo))


def coreml(directory: Path, memo: dict[str, Any]) -> Certificate:
    return coreml_certificate(_graph(directory, memo))


def directml(directory: Path, memo: dict[str, Any]) -> Certificate:
    return directml_certificate(_graph(directory, memo))
