"""Numbers a ``torch.export`` program reads from its own constants, folded into it: what
more than one target's lowering needs (a converter that traces through JAX cannot take a
read of a tensor's value; a delegate takes none of the operators around one).

Imports nothing of edgebuild: a converter that runs in an environment of its own, without
edgebuild (``edgebuild/targets/toolenv.py``), loads this file by the path its build passes.
"""

from __future__ import annotations

from typing import Any


# Ops that read a tensor's one value as a Python number.
_SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
# Ops that only check or bound such a number.
_SCALAR_CHECKS = ("aten::_assert_scalar", "aten::sym_constrain_range", "aten::sym_constrain_range_for_size")


def fold_constant_scalars(module: "Any", example: tuple["Any", ...]) -> int:
    """Replace each number the program reads from its own constants (``tensor.item()``,
    ``lengths.tolist()`` on a buffer) with its value, in ``module`` (an unlifted
    ``torch.export`` program). Returns how many were read.

    LiteRT's converter lowers through JAX, where such a read is a traced value with no
    number behind it (``ConcretizationTypeError``): the Qwen3.5 tower's attention splits
    q/k/v by ``cu_seqlens``, a buffer, which export keeps as data. Reads that depend on an
    input are left to the converter. The scalar arithmetic and runtime checks on the
    folded numbers are evaluated (a failing check raises its own message), and a split
    into one piece becomes the tensor it splits."""
    import operator

    import torch
    from torch.fx.node import map_arg

    graph = module.graph

    def op_name(node: "Any") -> str:
        schema = getattr(node.target, "_schema", None)
        return schema.name if schema is not None else ""

    def replace(node: "Any", value: "Any") -> None:
        for user in list(node.users):
            user.args = map_arg(user.args, lambda arg: value if arg is node else arg)
            user.kwargs = map_arg(user.kwargs, lambda arg: value if arg is node else arg)
        graph.erase_node(node)

    from_inputs: set[Any] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or any(arg in from_inputs for arg in node.all_input_nodes):
            from_inputs.add(node)
    reads = [node for node in graph.nodes
             if node.op == "call_function" and op_name(node) in _SCALAR_READS and node not in from_inputs]
    if not reads:
        return 0
    values: dict[Any, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: "Any") -> "Any":
            result = super().run_node(node)
            if node in reads:
                values[node] = result
            return result

    with torch.no_grad():
        Recorder(module).run(*example)
    for node in reads:
        replace(node, values[node])
    folded = True
    while folded:
        folded = False
        for node in list(graph.nodes):
            if node.op != "call_function" or node.all_input_nodes:
                continue
            if op_name(node) in _SCALAR_CHECKS:
                if op_name(node) == "aten::_assert_scalar" and not node.args[0]:
                    raise RuntimeError(node.args[1])
                graph.erase_node(node)
                folded = True
            elif getattr(node.target, "__module__", None) in ("_operator", "operator"):
                replace(node, node.target(*node.args, **node.kwargs))
                folded = True
    for node in list(graph.nodes):
        if (node.op == "call_function" and op_name(node) == "aten::split_with_sizes" and len(node.args[1]) == 1
                and all(user.target is operator.getitem and user.args[1] == 0 for user in node.users)):
            for user in list(node.users):
                user.replace_all_uses_with(node.args[0])
                graph.erase_node(user)
            graph.erase_node(node)
    graph.eliminate_dead_code()
    module.recompile()
    return len(reads)


def with_constant_scalars_folded(program: Any, example: tuple[Any, ...]) -> Any:
    """``program`` with the numbers it reads from its own constants folded in
    (:func:`fold_constant_scalars`), exported again; unchanged when it reads none, or when an
    input has a dynamic axis (a second export would need its ranges again).

    Each such read (``cu_seqlens.tolist()`` in the Qwen3.5 tower's attention), the checks
    on it and the split it sizes are operators no delegate takes: left to the portable
    kernels, and carried through every pass of the lowering. Folded, the same arithmetic
    on the same constants: the tiny tower's 3 blocks leave 118 nodes outside XNNPACK
    instead of 325 (outputs identical), and the full-width tower at 6 blocks lowers in
    13 s instead of 21. ``example``:
    one input of the program's shapes, as arrays (the constants are read on it)."""
    import torch

    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"]
    if any(isinstance(size, torch.SymInt) for node in placeholders
           for size in getattr(node.meta.get("val"), "shape", ())):
        return program
    inputs = tuple(torch.from_numpy(array) for array in example)
    try:
        module = program.module()
        if not fold_constant_scalars(module, inputs):
            return program
        return torch.export.export(module, inputs)
    except Exception:  # noqa: BLE001 - a program the fold or a second export cannot take
        # Folding only saves work: the program is lowered as it is (and what it cannot
        # lower, the lowering says).
        return program
