"""Building the QNN context: onnxruntime's EPContext generation compiles the QDQ graph
for the HTP backend of the chosen SoC (in a child process: see ``compile.py``) and
writes a graph holding one ``EPContext`` node per partition, beside the compiled
context binary."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from typing import Any

from edgebuild.ml.modules import describe_fallbacks, load_graph, modules_by_name
from edgebuild.plugin import BuildContext, BuildRejected, ExportError, Phases

from . import compile as compile_module
from .params import CONTEXT_BINARY_FILE, INFO_FILE, INFO_FORMAT, MODEL_FILE, PROVIDER, SOURCE_MODEL_FILE, QnnParams
from .qnn import qnn_version, require_qnn


def build(context: BuildContext[QnnParams]) -> dict[str, Any]:
    import onnx

    params = context.params
    require_qnn()
    source_model = context.source / SOURCE_MODEL_FILE
    _require_fixed_shapes(source_model, params.source)
    model_path = context.out_dir / MODEL_FILE
    phases = Phases()
    with phases.time("compile"):
        child = subprocess.run(
            [sys.executable, "-m", compile_module.__name__, str(source_model), str(model_path),
             str(params.soc_model), str(params.htp_arch)],
            capture_output=True, text=True,
        )
    lines = child.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if child.returncode != 0 or "partitions" not in result:
        if isinstance(result.get("error"), str):
            # The backend's own answer on this graph: it would be the same on the next try.
            raise BuildRejected(_rejection(source_model, params, result["error"], result.get("refused") or []))
        detail = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise ExportError(f"{source_model}: QNN context compilation failed: {detail}")
    placed = result["partitions"]
    # Counted in the session's graph: onnxruntime's own rewrites (a DequantizeLinear per
    # consumer, NHWC transposes around Conv) run before placement, so it has more nodes
    # than the file.
    on_qnn = sum(part["nodes"] for part in placed if part["provider"] == PROVIDER)
    elsewhere = sum(part["nodes"] for part in placed if part["provider"] != PROVIDER)
    if not model_path.is_file() or not (context.out_dir / CONTEXT_BINARY_FILE).is_file():
        written = ", ".join(sorted(path.name for path in context.out_dir.iterdir())) or "nothing"
        raise ExportError(f"EPContext generation wrote {written}; expected {MODEL_FILE} and {CONTEXT_BINARY_FILE}")
    context_nodes = list(onnx.load(str(model_path)).graph.node)
    sdk = next((attribute.s.decode() for node in context_nodes for attribute in node.attribute if attribute.name == "ep_sdk_version"), "")
    info = {
        "format": INFO_FORMAT,
        "soc_model": params.soc_model,
        "htp_arch": params.htp_arch,
        "source_nodes": result["source_nodes"],
        "nodes_on_qnn": on_qnn,
        "nodes_elsewhere": elsewhere,
        "partitions": placed,
        "context_nodes": dict(sorted(Counter(node.op_type for node in context_nodes).items())),
        "ep_sdk_version": sdk,
        **qnn_version(),
    }
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    context.log(f"compiled for soc_model {params.soc_model} (htp v{params.htp_arch}): {on_qnn} nodes in {len(placed)} "
                f"partition(s), {elsewhere} elsewhere; context binary {(context.out_dir / CONTEXT_BINARY_FILE).stat().st_size / 2**20:.1f} MiB")
    return {"timings": phases.seconds}


def _require_fixed_shapes(source_model: Any, source: str) -> None:
    """A QNN context is compiled for one shape: a graph input with a dynamic axis is a
    one-line error naming it, before the backend is asked."""
    graph = load_graph(source_model).graph
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        dynamic = [f"{axis} ({dim.dim_param or '?'})" for axis, dim in enumerate(dims) if not dim.HasField("dim_value")]
        if dynamic:
            raise ExportError(f"{source}: input {value.name} has dynamic axes {', '.join(dynamic)}; a QNN context is "
                              "compiled for fixed shapes: declare them without `dynamic:` on the artifact it is made from")


def _rejection(source_model: Any, params: QnnParams, error: str, refused: list[dict[str, str]]) -> str:
    """Why the backend refused the graph: the nodes it has no kernel for, each with the
    model module it was exported from, and what to try."""
    if not refused:
        return f"{source_model}: QNN context compilation failed: {error}"
    modules = modules_by_name(load_graph(source_model).graph)
    named = [entry | {"module": modules.get(entry["node"])} for entry in refused]
    ops = sorted({entry["op_type"] for entry in refused})
    return (f"{source_model}: QNN context compilation failed: the HTP backend (soc_model {params.soc_model}, "
            f"htp_arch {params.htp_arch}) does not take {len(refused)} node(s): {describe_fallbacks(named)}. "
            f"Hint: the backend has no kernel here for {', '.join(ops)} (at these types); change what those "
            "modules export to, export a submodule without them, or target another htp_arch")
