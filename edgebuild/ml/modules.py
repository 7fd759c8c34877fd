"""Which model module each node of an exported graph came from.

From the exporter's node metadata (torch's ONNX exporter writes
``pkg.torch.onnx.name_scopes``, so ``node_Conv_154`` reads as
``embeddings.patch_embedding``); nodes a quantizer added take the module of their
neighbours. Used by the coverage certificates and by kinds that
name the nodes a target's tool refused (a QNN compile): apart from the certificates'
tables, so that such a kind's build depends on this alone.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

# How many fallback nodes a description names before it counts the rest.
NAMED = 5


def _literal_list(text: str | None) -> list[str]:
    if not text:
        return []
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(item) for item in value] if isinstance(value, (list, tuple)) else []


def node_module(metadata: dict[str, str]) -> str | None:
    """The module path a node was exported from, from its ONNX ``metadata_props``; ``None``
    where the exporter left none. The last name scope is the operation itself, the one
    before it the innermost module; a wrapper module of edgebuild's own around the model
    (the first class of the hierarchy) is left out of the path."""
    scopes = _literal_list(metadata.get("pkg.torch.onnx.name_scopes"))
    modules = [scope for scope in scopes[:-1] if scope]
    if modules:
        module = modules[-1]
    else:
        namespace = metadata.get("namespace", "")
        parts = [part.split(":", 1)[0].strip() for part in namespace.split("/") if part.strip()]
        parts = [part for part in parts if part]
        if not parts:
            return None
        module = parts[-1]
    hierarchy = _literal_list(metadata.get("pkg.torch.onnx.class_hierarchy"))
    if hierarchy and hierarchy[0].startswith("edgebuild.") and modules:
        head, _, rest = module.partition(".")
        module = rest if head == modules[0] else module
        if module == modules[0]:
            return None
    return module or None


def _own_module(node: Any) -> str | None:
    return node_module({prop.key: prop.value for prop in node.metadata_props})


def _key(node: Any) -> tuple[str, tuple[str, ...]]:
    """A node's identity in its graph: its name and its outputs (unique in a valid graph;
    protobuf's Python objects are no identity: a node read twice may be two objects)."""
    return node.name, tuple(node.output)


def _modules(graph: Any) -> dict[tuple[str, tuple[str, ...]], str | None]:
    """Each node's module; a node the exporter did not write (a quantizer's
    ``QuantizeLinear``/``DequantizeLinear``) takes that of the first node consuming its
    output that has one, else of the node producing its input."""
    own = {_key(node): _own_module(node) for node in graph.node}
    producers = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found = {}
    for node in graph.node:
        module = own[_key(node)]
        if module is None:
            near = [other for output in node.output for other in consumers.get(output, [])]
            near += [producers[name] for name in node.input if name in producers]
            module = next((own[_key(other)] for other in near if own[_key(other)] is not None), None)
        found[_key(node)] = module
    return found


def modules_by_name(graph: Any) -> dict[str, str | None]:
    """Each named node's module (Q/DQ nodes by their neighbours, as :func:`_modules`)."""
    found = _modules(graph)
    return {node.name: found[_key(node)] for node in graph.node if node.name}


def describe_fallbacks(fallbacks: list[dict[str, Any]]) -> str:
    """The first few fallback nodes with their op types and modules, then how many more."""
    named = []
    for entry in fallbacks[:NAMED]:
        where = ", ".join(part for part in (entry.get("op_type"), entry.get("module")) if part)
        named.append(f"{entry.get('node') or 'a node'} ({where})" if where else str(entry.get("node") or "a node"))
    more = len(fallbacks) - NAMED
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def load_graph(path: Path) -> Any:
    """The ONNX graph's structure (its weights' bytes are not read), with inferred shapes."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return onnx.shape_inference.infer_shapes(model)
