"""The tensors at the ends of a model's modules, as a runtime computes them.

Divergence (``edgebuild/run/divergence.py``) compares an artifact with the float model
of its chain module by module; what it needs of each runtime is, for one feed, the
tensor each module hands on, by the module's path in the model (``encoder.layers.3``,
``encoder.layers.3.mlp``: transformers' own module tree, as ``named_modules`` names it
and as torch's ONNX exporter records it in ``pkg.torch.onnx.name_scopes``).

- A PyTorch module: a forward hook on each module keeps its output (the first tensor of
  it); a module called more than once keeps its last call.
- An ONNX graph: the end of a module is the output of its last node in the graph's
  (topological) order -- of its own nodes or its descendants' -- other than a
  ``QuantizeLinear`` (whose integers are not the module's values; the dequantized
  tensor after it is). The graph is run once more with those tensors as extra outputs.

Module paths are the model's own: a wrapper module of edgebuild's around the model
(``named_outputs_module``'s ``inner``) is left out, as :func:`edgebuild.ml.modules.node_module`
leaves it out of a node's module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import numpy
    import torch

Feed = dict[str, "numpy.ndarray"]
Taps = Callable[[Feed], "dict[str, numpy.ndarray]"]

# Ops whose output is not a module's value in its own type.
_NOT_A_VALUE = frozenset({"QuantizeLinear"})
# The nodes a quantizer adds around a module's own.
_QUANTIZER_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def module_depth(path: str) -> int:
    """How deep a module path is, an index counting with the name before it:
    ``encoder`` 1, ``encoder.layers.3`` 2, ``encoder.layers.3.mlp`` 3."""
    return sum(1 for part in path.split(".") if not part.isdigit())


def _enclosing(path: str) -> list[str]:
    """``path`` and every module that holds it, innermost first."""
    parts = path.split(".")
    return [".".join(parts[:end]) for end in range(len(parts), 0, -1)]


def graph_module_ends(model: Any) -> dict[str, tuple[str, list[str]]]:
    """For each module of an ONNX ``model`` (a ModelProto, its weights' bytes not needed):
    the tensor that ends it and the names of its nodes (its descendants' included; those
    that compute first, then the quantizer's Q/DQ pairs), in the order the modules end in
    the graph."""
    from edgebuild.ml.modules import modules_by_name

    modules = modules_by_name(model.graph)
    ends: dict[str, tuple[int, str]] = {}
    computing: dict[str, list[str]] = {}
    quantizing: dict[str, list[str]] = {}
    for index, node in enumerate(model.graph.node):
        module = modules.get(node.name)
        if not module:
            continue
        into = quantizing if node.op_type in _QUANTIZER_OPS else computing
        for path in _enclosing(module):
            into.setdefault(path, []).append(node.name)
            if node.op_type not in _NOT_A_VALUE and node.output and node.output[0]:
                ends[path] = (index, node.output[0])
    ordered = sorted(ends.items(), key=lambda item: item[1][0])
    return {path: (tensor, computing.get(path, []) + quantizing.get(path, [])) for path, (_, tensor) in ordered}


def onnx_taps(path: Path, threads: int | None = None) -> Taps:
    """The module ends of the graph at ``path`` on onnxruntime's CPU provider: the graph
    with them as extra outputs, loaded (weights included) when first asked."""
    session: list[Any] = []
    ends: dict[str, str] = {}

    def open_tapped() -> Any:
        import onnx
        import onnxruntime

        model = onnx.load(str(path))
        found = graph_module_ends(model)
        declared = {output.name for output in model.graph.output}
        for module, (tensor, _) in found.items():
            ends[module] = tensor
            if tensor not in declared:
                model.graph.output.append(onnx.ValueInfoProto(name=tensor))
                declared.add(tensor)
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

    def taps(feed: Feed) -> "dict[str, numpy.ndarray]":
        import numpy

        if not session:
            session.append(open_tapped())
        names = sorted(set(ends.values()))
        values = dict(zip(names, session[0].run(names, feed)))
        return {module: numpy.asarray(values[tensor], dtype=numpy.float32) for module, tensor in ends.items()
                if numpy.issubdtype(numpy.asarray(values[tensor]).dtype, numpy.floating)}

    return taps


def torch_taps(model: "torch.nn.Module", call: Callable[[Feed], Any]) -> Taps:
    """The module ends of ``model`` when ``call(feed)`` runs it: a forward hook on every
    module for the call's length. A wrapper of edgebuild's around the model (its class
    defined in ``edgebuild``) is left out of the paths."""
    wrapped = type(model).__module__.startswith("edgebuild.")

    def taps(feed: Feed) -> "dict[str, numpy.ndarray]":
        import torch

        kept: dict[str, Any] = {}
        handles = []
        for name, module in model.named_modules():
            path = name.partition(".")[2] if wrapped else name
            if not path:
                continue

            def hook(_module: Any, _args: Any, output: Any, path: str = path) -> None:
                tensor = _first_tensor(output)
                if tensor is not None and tensor.is_floating_point():
                    # Popped and put back: the order of the dict is the order modules end in.
                    kept.pop(path, None)
                    kept[path] = tensor.detach().float().numpy().copy()

            handles.append(module.register_forward_hook(hook))
        try:
            with torch.no_grad():
                call(feed)
        finally:
            for handle in handles:
                handle.remove()
        return kept

    return taps


def _first_tensor(output: Any) -> "torch.Tensor | None":
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        for item in output:
            found = _first_tensor(item)
            if found is not None:
                return found
        return None
    if isinstance(output, dict) or hasattr(output, "values"):
        try:
            values = list(output.values())
        except TypeError:
            return None
        return _first_tensor(values)
    return None
