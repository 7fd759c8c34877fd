"""Lowering the program to an ExecuTorch ``.pte``: ``to_edge_transform_and_lower`` with the
delegate's partitioner (``lowering.py`` takes out two costs that grow with depth), then
``to_executorch``, XNNPACK's pattern graphs made first unless the fork server made them
(``patterns.py``); what was delegated goes to
``executorch.json`` (``get_delegation_info``: nodes delegated and not, per operator; and
each node not delegated, with the model module it came from)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from edgebuild.plugin import BuildContext, ExportError, Phases
from edgebuild.targets.folding import with_constant_scalars_folded
from edgebuild.targets.program import (dynamic_axes, example_arrays, load_program, program_info, program_path,
                                       traced_module)

from .lowering import faster_lowering
from .params import INFO_FILE, INFO_FORMAT, PROGRAM_FILE, ExecutorchParams
from .patterns import make_patterns


def build(context: BuildContext[ExecutorchParams]) -> dict[str, Any]:
    from executorch.devtools.backend_debug import get_delegation_info
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    params = context.params
    phases = Phases()
    source = context.source
    with phases.time("load"):
        program = load_program(program_path(source))
    with phases.time("fold"):
        # One input (the first of the sizes a dynamic axis is fed at: such a program is not folded).
        program = with_constant_scalars_folded(program, tuple(example_arrays(program_info(source))))
    patterns = None
    if params.delegate == "xnnpack":
        with phases.time("patterns"):
            # Made already where this worker was forked from the fork server.
            patterns = make_patterns()
    with phases.time("lower"):
        try:
            with faster_lowering():
                # The edge dialect's verifier re-checks every node's operator and dtypes after
                # each pass (~20 s of the full-size tower's lowering); a program it would refuse
                # fails in to_executorch or when the runtime loads it, and verification runs
                # every .pte. The bytes are the same either way.
                edge = to_edge_transform_and_lower(program, partitioner=_partitioners(params.delegate),
                                                   compile_config=EdgeCompileConfig(_check_ir_validity=False))
                delegation = get_delegation_info(edge.exported_program().graph_module)
                # Before to_executorch, whose passes add memory planning nodes to the same graph.
                fallback_nodes = _fallback_nodes(edge.exported_program().graph_module)
                lowered = edge.to_executorch()
        except Exception as error:  # ExecuTorch raises what its passes do, several lines of it
            reason = " ".join(str(error).split())[:400]
            raise ExportError(f"ExecuTorch cannot lower {params.source}'s program ({params.delegate}): "
                              f"{type(error).__name__}: {reason}") from None
    with open(context.out_dir / PROGRAM_FILE, "wb") as handle:
        # Straight to the file: ``.buffer`` would first join the program (1.8 GB for the
        # full-size tower) into one more bytes object.
        lowered.write_to_file(handle)
    by_operator = {op: {"delegated": int(counts.delegated), "not_delegated": int(counts.non_delegated)}
                   for op, counts in sorted(delegation.delegation_by_operator.items())}
    info = {
        "format": INFO_FORMAT,
        "delegate": params.delegate,
        "delegated_nodes": int(delegation.num_delegated_nodes),
        "not_delegated_nodes": int(delegation.num_non_delegated_nodes),
        "delegated_subgraphs": int(delegation.num_delegated_subgraphs),
        "by_operator": by_operator,
        # The nodes left to ExecuTorch's portable kernels, each with the model module it came from.
        "fallback_nodes": fallback_nodes,
    }
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    context.log(f"lowered to ExecuTorch ({params.delegate}): {info['delegated_nodes']} nodes delegated in "
                f"{info['delegated_subgraphs']} subgraph(s), {info['not_delegated_nodes']} not")
    return {"timings": phases.seconds, **({"xnnpack_patterns": patterns} if patterns else {})}


def _partitioners(delegate: str) -> list[Any]:
    if delegate == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return [XnnpackPartitioner()]
    if delegate == "coreml":
        from executorch.backends.apple.coreml.partition import CoreMLPartitioner

        return [CoreMLPartitioner()]
    return []


def _fallback_nodes(graph_module: Any) -> list[dict[str, Any]]:
    """The nodes ``get_delegation_info`` counts as not delegated (every call outside a
    delegate), with their operator as it names them and their module path."""
    found = []
    for node in graph_module.graph.nodes:
        op_type = re.sub(r"_[\d]+$", "", node.name)
        if node.op != "call_function" or op_type == "executorch_call_delegate":
            continue
        found.append({"node": node.name, "op_type": op_type, "module": traced_module(node)})
    return found


# ExecuTorch's scalar types (``executorch.exir.scalar_type.ScalarType``) by their NumPy names.
_NUMPY_NAMES = {
    "BYTE": "uint8", "CHAR": "int8", "SHORT": "int16", "INT": "int32", "LONG": "int64", "HALF": "float16",
    "FLOAT": "float32", "DOUBLE": "float64", "COMPLEX64": "complex64", "COMPLEX128": "complex128", "BOOL": "bool",
    "BFLOAT16": "bfloat16", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
}


def program_signature(path: Path, source: Path) -> dict[str, list[dict[str, Any]]]:
    """What the ``.pte``'s ``forward`` takes and gives (``consumer.json``'s ``programs``), from
    its method meta: dtype and sizes as the file declares them (a dynamic axis of the program
    in ``source`` left open: the file holds its largest size), named in the program's order
    (the runtime takes a tuple, and the file keeps no names)."""
    from executorch.exir.scalar_type import ScalarType
    from executorch.runtime import Runtime

    info = program_info(source)
    open_axes = dynamic_axes(source, info)
    meta = Runtime.get().load_program(str(path)).metadata("forward")
    declared = {"inputs": [meta.input_tensor_meta(index) for index in range(meta.num_inputs())],
                "outputs": [meta.output_tensor_meta(index) for index in range(meta.num_outputs())]}
    described: dict[str, list[dict[str, Any]]] = {}
    for side, tensors in declared.items():
        specs = info[side]
        if len(specs) != len(tensors):
            raise ExportError(f"{path.name}: its forward has {len(tensors)} {side}, and the program it was lowered "
                              f"from {len(specs)}")
        described[side] = []
        for spec, tensor, axes in zip(specs, tensors, open_axes[side]):
            scalar_type = ScalarType(tensor.dtype()).name
            described[side].append({
                "name": spec["name"], "dtype": _NUMPY_NAMES.get(scalar_type, scalar_type.lower()),
                "shape": [None if axis in axes else int(size) for axis, size in enumerate(tensor.sizes())],
            })
    return described
