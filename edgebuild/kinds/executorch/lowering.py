"""Two costs of ExecuTorch's lowering that grow with a model's depth, taken out while the
lowered program stays byte for byte the same.

Measured on the full-size Qwen3.5 tower at 224 (27 blocks, 191 XNNPACK subgraphs; ExecuTorch
1.5.1, torch 2.13), the lowering took 180 s, little of it on tensors:

- ``create_submodule_from_nodes`` topologically sorts the *whole* top-level graph after
  carving out *each* delegate subgraph (``legalize_graph``), by copying every node into a
  new graph and recompiling the module: subgraphs x nodes, 58 s of the 180. Here the same
  order (Kahn's, with the same prioritized operators, and each node's users re-ordered as
  the copy would have them) is applied in place, and the module recompiled once after all
  subgraphs are cut: 2.6 s.
- ``torch.fx.traceback.NodeSource`` deep-copies a node's whole ``from_node`` history each
  time a pass touches the node, and the history only grows. Here each new record shares its
  (never changed) ancestors instead of copying them; ``from_node`` reads the same.

Both are applied only for the versions they were checked against (:data:`CHECKED`), only
inside :func:`faster_lowering`, and undone on the way out; any other version lowers as
ExecuTorch does. ``tests/test_executorch.py`` lowers the tiny tower both ways and compares
the bytes, so an upgrade that changes either function fails there, not in a user's build.
"""

from __future__ import annotations

import collections
import contextlib
import operator
from typing import Any, Iterator

# (executorch, torch) version prefixes the patches were checked against, byte for byte.
CHECKED = (("1.5.", "2.13."),)


def patches_apply() -> bool:
    """Whether the installed ExecuTorch and torch are versions :data:`CHECKED` holds."""
    import torch
    from executorch.version import __version__

    return any(__version__.startswith(executorch) and torch.__version__.startswith(torch_version)
               for executorch, torch_version in CHECKED)


@contextlib.contextmanager
def faster_lowering() -> Iterator[bool]:
    """Within the block, ExecuTorch lowers with both changes; yields whether they are on.
    They are process-wide while on (this runs in a build worker of its own)."""
    import torch.fx.traceback as fx_traceback

    import executorch.exir.backend.backend_api as backend_api
    import executorch.exir.lowered_backend_module as lowered_backend_module

    if not (patches_apply() and hasattr(lowered_backend_module, "legalize_graph")
            and hasattr(backend_api, "_create_partitions_in_graph_module")):
        yield False
        return
    saved = (lowered_backend_module.legalize_graph, backend_api._create_partitions_in_graph_module,
             fx_traceback.NodeSource.__init__)
    create_partitions, node_source_init = saved[1], saved[2]

    def create_partitions_then_recompile(tagged_graph_module: Any, *args: Any, **kwargs: Any) -> Any:
        result = create_partitions(tagged_graph_module, *args, **kwargs)
        # Once, for every legalize_graph skipped while the subgraphs were cut.
        tagged_graph_module.recompile()
        return result

    def shallow_node_source(self: Any, node: Any, pass_name: str = "", action: Any = None) -> None:
        history = node.meta.get("from_node") if node is not None else None
        if not history:
            node_source_init(self, node, pass_name, action)
            return
        node.meta["from_node"] = []
        try:
            node_source_init(self, node, pass_name, action)
        finally:
            node.meta["from_node"] = history
        self.from_node = list(history)

    lowered_backend_module.legalize_graph = _legalize_in_place
    backend_api._create_partitions_in_graph_module = create_partitions_then_recompile
    fx_traceback.NodeSource.__init__ = shallow_node_source
    try:
        yield True
    finally:
        (lowered_backend_module.legalize_graph, backend_api._create_partitions_in_graph_module,
         fx_traceback.NodeSource.__init__) = saved


def _legalize_in_place(graph_module: Any) -> Any:
    """``torch.fx.passes.tools_common.legalize_graph``'s order, given to the graph's own
    nodes (no copy, no recompile: the caller recompiles once)."""
    import torch

    prioritized = {
        operator.add, operator.mul, operator.sub, operator.floordiv, operator.truediv, operator.mod,
        operator.le, operator.lt, operator.ge, operator.gt, operator.eq, operator.ne,
        torch.ops.aten.sym_constrain_range.default, torch.ops.aten.sym_constrain_range_for_size.default,
        torch.ops.aten._assert_async.msg, torch.ops.aten.scalar_tensor.default, torch.ops.aten._assert_scalar.default,
    }
    graph = graph_module.graph
    nodes = list(graph.nodes)
    indegree = dict.fromkeys(nodes, 0)
    for node in nodes:
        for user in node.users:
            indegree[user] += 1
    queue = collections.deque(node for node in nodes if indegree[node] == 0)
    order = []
    while queue:
        current = queue.popleft()
        order.append(current)
        for user in current.users:
            indegree[user] -= 1
            if indegree[user] == 0:
                if user.op == "call_function" and user.target in prioritized:
                    queue.appendleft(user)
                else:
                    queue.append(user)
    if len(order) < len(nodes):
        raise RuntimeError(f"Input graph has cycles, unable to add {[node for node in indegree if indegree[node] != 0]}")
    position = {node: index for index, node in enumerate(order)}
    root = graph._root
    for node in order:
        root.prepend(node)  # before the root: to the end of the list, in order
    for node in order:
        # The copy registers each user as it copies it: users in the new order.
        if len(node.users) > 1:
            node.users = dict(sorted(node.users.items(), key=lambda item: position[item[0]]))
    return graph_module
