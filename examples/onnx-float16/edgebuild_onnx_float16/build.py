"""Converting the source graph to float16 with onnxruntime's converter, saved with its
weights beside it; ``float16.json`` says what was asked and what stayed in float32."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.plugin import BuildContext, ExportError, Phases

from . import Float16Params, INFO_FILE, MODEL_FILE, WEIGHTS_FILE
from .coverage import float32_nodes


def build(context: BuildContext[Float16Params]) -> dict[str, Any]:
    import onnx
    import onnxruntime
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    params = context.params
    phases = Phases()
    with phases.time("load"):
        model = onnx.load(str(context.source / MODEL_FILE))
    blocked = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(params.op_block_list))
    with phases.time("convert"):
        try:
            converted = convert_float_to_float16(model, keep_io_types=params.keep_io_types, op_block_list=blocked)
        except Exception as error:  # the converter raises what onnx's shape inference does
            raise ExportError(f"onnxruntime's float16 converter cannot take {params.source}'s graph: "
                              f"{type(error).__name__}: {' '.join(str(error).split())[:300]}") from None
        # The converter appends the Casts it adds at the end; ONNX wants nodes in
        # topological order (and the partitioning of every certificate reads them so).
        sort_topologically(converted.graph)
    with phases.time("save"):
        onnx.save_model(converted, str(context.out_dir / MODEL_FILE), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=WEIGHTS_FILE)
    kept = float32_nodes(converted)
    info = {"format": 1, "converter": f"onnxruntime {onnxruntime.__version__}", "keep_io_types": params.keep_io_types,
            "op_block_list": blocked, "float32_nodes": len(kept)}
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    context.log(f"converted to float16: {len(kept)} nodes kept in float32")
    return {"timings": phases.seconds}


def sort_topologically(graph: Any) -> None:
    """``graph``'s nodes in an order where each comes after the nodes whose outputs it reads,
    the given order kept otherwise (a node waits only for what it reads)."""
    available = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        ready = [node for node in pending if set(node.input) <= available]
        if not ready:
            raise ExportError(f"the converted graph has a cycle or reads a tensor nothing makes: "
                              f"{sorted(set(pending[0].input) - available)}")
        for node in ready:
            available.update(node.output)
        ordered += ready
        pending = [node for node in pending if node not in ready]
    del graph.node[:]
    graph.node.extend(ordered)
