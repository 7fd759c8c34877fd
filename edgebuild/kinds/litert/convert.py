"""Converting a ``torch.export`` program to a LiteRT ``.tflite``, in the environment that
holds the converter (``edgebuild/ml/toolenv.py``: edgebuild's own, or one of its own).

    python convert.py PROGRAM EXAMPLE_NPZ OUT_TFLITE

Imports nothing of edgebuild: the converter's environment need not have it. The example
inputs (an ``.npz`` of arrays ``0``, ``1``, ... in the program's input order) fix the
shapes. Prints one JSON line: ``{"ok": true}`` or ``{"error": "..."}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def convert(program_path: str, example_path: str, out_path: str) -> None:
    import warnings

    import numpy
    import torch

    warnings.filterwarnings("ignore")
    import litert_torch

    program = torch.export.load(program_path)
    with numpy.load(example_path) as arrays:
        example = tuple(torch.from_numpy(arrays[str(index)]) for index in range(len(arrays.files)))
    module = program.module()
    fold_constant_scalars(module, example)
    litert_torch.convert(module, example).export(out_path)


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


def main() -> int:
    program_path, example_path, out_path = sys.argv[1:4]
    try:
        convert(program_path, example_path, out_path)
    except Exception as error:  # the converter raises what jax and MLIR do
        print(json.dumps({"error": f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"}))
        return 1
    print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
