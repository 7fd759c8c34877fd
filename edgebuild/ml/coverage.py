"""Coverage certificates: which nodes of an artifact's graph a target takes, known on
this machine before any device runs it.

A certificate names its target, the tool that answered and its version, what was
assumed (an architecture, a feature level, a static table), the nodes in all and the
nodes taken, the partitions the taken nodes form, and every node that falls back, with
its op type and the model module it came from (from the exporter's node metadata:
torch's ONNX exporter writes ``pkg.torch.onnx.name_scopes``, so ``node_Conv_154`` reads
as ``embeddings.patch_embedding``).

Targets and their sources:

- ``nnapi``, ``coreml``: onnxruntime's mobile usability checker
  (``onnxruntime.tools.mobile_helpers.usability_checker``): its static tables of what the
  NNAPI and Core ML (MLProgram) providers take, with its estimate of the partitions;
- ``directml``: the static table of DML kernel registrations in
  :mod:`edgebuild.ml.directml_kernels`, with the ``Reshape allowzero=1`` rule, partitioned
  by the same estimate;
- ``openvino_cpu``: ``openvino.Core().query_model`` on the IR: the CPU plugin's own answer;
- ``xnnpack``: ExecuTorch's delegation summary, recorded at build time;
- ``qnn_htp``: the QNN execution provider's placement, recorded at compile time (the
  real provider, with CPU fallback disabled).

Pure functions of files and recorded build information: nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from edgebuild.ml.modules import _key, _modules, load_graph

TARGETS = ("nnapi", "coreml", "directml", "openvino_cpu", "xnnpack", "qnn_htp")


@dataclass
class Certificate:
    """What one target takes of one artifact's graph."""

    target: str
    tool: str
    tool_version: str
    assumption: str
    nodes_total: int
    nodes_taken: int
    partitions: int
    # Every node the target does not take: {node, op_type, module} (node or module None
    # where the tool does not say).
    fallbacks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return self.nodes_taken / self.nodes_total if self.nodes_total else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fraction": round(self.fraction, 6)}


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


# --- ONNX graphs: static tables -------------------------------------------------------------

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
    return _onnx_certificate("nnapi", "onnxruntime usability_checker", _version("onnxruntime"),
                             "NNAPI, onnxruntime's static table (nnapi_supported_ops.md); the graph as built, "
                             "before onnxruntime's optimizations; per-op caveats unchecked", model, info)


def coreml_certificate(model: Any) -> Certificate:
    """Core ML (MLProgram) through onnxruntime's usability checker."""
    from onnxruntime.tools.mobile_helpers.usability_checker import check_coreml_partitions

    info = check_coreml_partitions(model, True, "coreml_supported_mlprogram_ops.md")
    return _onnx_certificate("coreml", "onnxruntime usability_checker", _version("onnxruntime"),
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

    from edgebuild.ml.directml_kernels import MICROSOFT_KERNELS, ONNX_KERNELS

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

    from edgebuild.ml.directml_kernels import SOURCE

    opsets = {entry.domain: entry.version for entry in model.opset_import}
    info = check_partitioning(model.graph, _DirectmlTable(opsets), require_fixed_input_sizes=False)  # type: ignore[arg-type]
    return _onnx_certificate("directml", "edgebuild directml_kernels", SOURCE,
                             "DirectML, static table of onnxruntime's DML kernel registrations by operator and "
                             "opset, plus Reshape allowzero=1 refused; types and feature levels unchecked",
                             model, info)


ONNX_TARGETS = {"nnapi": nnapi_certificate, "coreml": coreml_certificate, "directml": directml_certificate}


# --- OpenVINO: the plugin's own answer --------------------------------------------------------

# Ops that carry no computation: not counted as nodes.
_OPENVINO_STRUCTURAL = frozenset({"Parameter", "Result", "Constant"})


def openvino_op_module(name: str, modules: dict[str, str]) -> str | None:
    """The model module of an OpenVINO op converted from a ``torch.export`` program: the
    converter names it ``<node>/<aten op>/<op>`` after the program's node."""
    return modules.get(name.split("/", 1)[0])


def openvino_certificate(model_xml: Path, device: str = "CPU", modules: dict[str, str] | None = None) -> Certificate:
    """``query_model`` of the OpenVINO ``device`` plugin on the IR: the ops it takes.
    ``modules``: the program's node -> model module (the build's record)."""
    def module(op: Any) -> str | None:
        return openvino_op_module(op.get_friendly_name(), modules or {})

    import openvino

    core = openvino.Core()
    model = core.read_model(str(model_xml))
    placed = core.query_model(model, device)
    ops = [op for op in model.get_ordered_ops() if op.get_type_name() not in _OPENVINO_STRUCTURAL]
    taken = [op for op in ops if placed.get(op.get_friendly_name()) == device]
    missing = [op for op in ops if placed.get(op.get_friendly_name()) != device]
    return Certificate(
        target=f"openvino_{device.lower()}", tool=f"openvino Core.query_model({device})",
        tool_version=openvino.get_version(), assumption=f"the {device} plugin installed here, answering for itself",
        nodes_total=len(ops), nodes_taken=len(taken), partitions=1 if taken else 0,
        fallbacks=[{"node": op.get_friendly_name(), "op_type": op.get_type_name(), "module": module(op)}
                   for op in missing],
    )


# --- from what a build recorded ------------------------------------------------------------

def xnnpack_certificate(info: dict[str, Any], executorch_version: str | None = None) -> Certificate:
    """ExecuTorch's delegation summary (``executorch.json`` of an ``executorch`` build)."""
    fallbacks = info.get("fallback_nodes")
    if fallbacks is None:
        fallbacks = [{"node": None, "op_type": op, "module": None}
                     for op, counts in sorted(info.get("by_operator", {}).items())
                     for _ in range(int(counts.get("not_delegated", 0)))]
    delegated, other = int(info["delegated_nodes"]), int(info["not_delegated_nodes"])
    return Certificate(
        target="xnnpack", tool="executorch get_delegation_info",
        tool_version=executorch_version or _version("executorch"),
        assumption=f"the {info.get('delegate', 'xnnpack')} partitioner at build time; nodes of the edge program",
        nodes_total=delegated + other, nodes_taken=delegated, partitions=int(info["delegated_subgraphs"]),
        fallbacks=list(fallbacks),
    )


def qnn_certificate(info: dict[str, Any], provider: str = "QNNExecutionProvider") -> Certificate:
    """The QNN execution provider's placement of the session's graph (``context.json`` of a
    ``qnn_context`` build): the real provider on the HTP backend, at the SoC's architecture."""
    parts = info.get("partitions", [])
    fallbacks = [{"node": None, "op_type": op, "module": None}
                 for part in parts if part["provider"] != provider
                 for op, count in sorted(part.get("ops", {}).items()) for _ in range(int(count))]
    return Certificate(
        target="qnn_htp", tool=f"onnxruntime-qnn ({provider}), QNN SDK {info.get('qnn_sdk', 'unknown')}",
        tool_version=str(info.get("onnxruntime_qnn", "unknown")),
        assumption=f"soc_model {info.get('soc_model')}, HTP v{info.get('htp_arch')}; the session's graph after "
                   "onnxruntime's rewrites, CPU fallback disabled",
        nodes_total=int(info["nodes_on_qnn"]) + int(info["nodes_elsewhere"]), nodes_taken=int(info["nodes_on_qnn"]),
        partitions=sum(1 for part in parts if part["provider"] == provider), fallbacks=fallbacks,
    )
