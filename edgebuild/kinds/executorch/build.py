"""Lowering the program to an ExecuTorch ``.pte``: ``to_edge_transform_and_lower`` with the
delegate's partitioner (``lowering.py`` takes out two costs that grow with depth), then
``to_executorch``, XNNPACK's pattern graphs made first unless the fork server made them
(``patterns.py``); what was delegated goes to
``executorch.json`` (``get_delegation_info``: nodes delegated and not, per operator; and
each node not delegated, with the model module it came from)."""

from __future__ import annotations

import json
import re
from typing import Any

from edgebuild.plugin import BuildContext, ExportError, Phases
from edgebuild.targets.folding import with_constant_scalars_folded
from edgebuild.targets.program import example_arrays, load_program, program_info, program_path, traced_module

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
