"""ONNX helpers shared by the kinds that export graphs: sanitising, inspecting,
and measuring where onnxruntime places each node."""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

from edgebuild.errors import ExportError

# What torch's ONNX exporter imports on its first export (the kinds' ``worker_imports``).
EXPORT_IMPORTS = ("onnxscript", "torch.onnx._internal.exporter._core")
# What warms the exporter up in the fork server once it has forked a build (the kinds'
# ``build_warmups``): :func:`warm_up_exporter`.
EXPORT_WARMUPS = ("edgebuild.ml.exporter_warmup",)

# The opsets torch's dynamo exporter can write: it exports at 18 and converts with
# onnxscript's version converter (up to 25), falling back to onnx's own converter up
# to the highest opset onnx knows (28 in onnx 1.23; a test checks the installed one).
# onnxruntime 1.32 ran a graph of each (measured). Asked for more, the exporter
# quietly writes 18, so a manifest asking for more is refused up front.
EXPORTER_MIN_OPSET = 18
EXPORTER_MAX_OPSET = 28
# Node metadata the exporter writes that names source files and line numbers: it
# differs between two checkouts of the same code, so it never goes into a graph.
SOURCE_LOCATION_KEYS = frozenset({"pkg.torch.onnx.stack_trace"})


def export_onnx(
    module: Any, example: tuple[Any, ...], path: Path, input_names: list[str], output_names: list[str], opset: int,
    dynamic_shapes: Any = None,
) -> None:
    """torch's dynamo exporter, optimised, weights in one external ``<name>.data`` file;
    ``dynamic_shapes`` as ``torch.export`` takes them (``None``: every shape fixed)."""
    import onnx

    _run_exporter(module, example, str(path), input_names, output_names, opset, dynamic_shapes=dynamic_shapes,
                  external_data=True)
    weights = path.with_name(path.name + ".data")
    if not weights.exists():
        # Graphs under the exporter's size threshold come back inline; keep one layout.
        save_with_external_data(onnx.load(str(path)), path)
    model = onnx.load(str(path), load_external_data=False)
    written = graph_opset(model)
    if written != opset:
        raise ExportError(f"asked torch's exporter for opset {opset}, it wrote opset {written}; refusing the graph")
    if strip_source_locations(model):
        onnx.save(model, str(path))


def _run_exporter(module: Any, example: tuple[Any, ...], destination: str | None, input_names: list[str],
                  output_names: list[str], opset: int, **options: Any) -> Any:
    """torch's dynamo exporter, optimised, as every export here runs it (to ``destination``,
    or kept in memory for ``None``); its ONNX program. Quiet: the exporter logs one warning
    per torchvision op it cannot register and a FutureWarning from torch's own pytree
    code, and neither concerns the graph."""
    import logging
    import warnings

    import torch

    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return torch.onnx.export(module, example, destination, input_names=input_names, output_names=output_names,
                                 opset_version=opset, dynamo=True, optimize=True, verbose=False, **options)


def warm_up_exporter() -> None:
    """One export by torch's exporter, as :func:`export_onnx` runs it, of a small module (a
    convolution, layer norm, attention and an MLP, the ops of a vision encoder), kept in
    memory: torch's exporter does work on its first export in a process that later exports
    reuse, whatever the first exported. The tiny CLIP encoder's export in a worker forked
    after this took 0.73x the time of one forked before it (``bench/exporter_warmup.py``).
    Nothing is written to disk, so a server killed during it leaves nothing behind. The
    random generator's state is put back: a process that warmed up draws the same numbers
    after as before."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patches = torch.nn.Conv2d(3, 8, 4, stride=4)
            self.norm = torch.nn.LayerNorm(8)
            self.qkv = torch.nn.Linear(8, 24)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))

        def forward(self, pixels: "torch.Tensor") -> "torch.Tensor":
            tokens = self.patches(pixels).flatten(2).transpose(1, 2)
            query, key, value = self.qkv(self.norm(tokens)).reshape(1, -1, 3, 2, 4).permute(2, 0, 3, 1, 4)
            attended = torch.nn.functional.scaled_dot_product_attention(query, key, value)
            tokens = tokens + attended.transpose(1, 2).reshape(1, -1, 8)
            return (tokens + self.mlp(self.norm(tokens))).mean(dim=1).softmax(dim=-1)

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        program = _run_exporter(Block().eval(), (torch.zeros(1, 3, 8, 8),), None, ["pixels"], ["scores"],
                                EXPORTER_MIN_OPSET)
        # What saving does before it writes: the graph serialised to a protobuf.
        program.model_proto.SerializeToString()


def graph_opset(model: Any) -> int | None:
    """The default-domain opset a graph imports."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def strip_source_locations(model: Any) -> int:
    """Remove the exporter's source locations (file paths, line numbers) from every
    node; return how many entries were removed. Everything else it records (module
    names, fx node names) is a function of the code and stays, for debugging."""
    removed = 0
    function_nodes = [node for function in model.functions for node in function.node]
    for node in [*_all_nodes(model.graph), *function_nodes]:
        kept = [entry for entry in node.metadata_props if entry.key not in SOURCE_LOCATION_KEYS]
        if len(kept) != len(node.metadata_props):
            removed += len(node.metadata_props) - len(kept)
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
    return removed


def sanitize_allowzero(path: Path) -> int:
    """Clear ``allowzero=1`` on every ``Reshape``; return how many were cleared.

    torch's dynamo exporter emits it, and onnxruntime's provider for Windows GPUs
    (DML) rejects it at session initialisation -- after which onnxruntime quietly
    hands back a CPU session. Measured on the 27B tower: 0 of 1171 nodes on
    the iGPU before, 85 of 113 after. Only the graph file is rewritten; the
    external weights are left where they are.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    cleared = 0
    for node in _all_nodes(model.graph):
        if node.op_type != "Reshape":
            continue
        for attribute in node.attribute:
            if attribute.name == "allowzero" and attribute.i == 1:
                attribute.i = 0
                cleared += 1
    if cleared:
        onnx.save(model, str(path))
    return cleared


def graph_summary(path: Path) -> dict[str, Any]:
    """Op histogram, ``allowzero`` count and input/output signatures of a saved graph."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    nodes = list(_all_nodes(model.graph))
    allowzero = sum(
        1
        for node in nodes
        if node.op_type == "Reshape"
        for attribute in node.attribute
        if attribute.name == "allowzero" and attribute.i == 1
    )
    return {
        "opset": graph_opset(model),
        "nodes": len(nodes),
        "ops": dict(sorted(Counter(node.op_type for node in nodes).items())),
        "allowzero_reshapes": allowzero,
        "inputs": [_value_info(value) for value in model.graph.input],
        "outputs": [_value_info(value) for value in model.graph.output],
    }


def _value_info(value: Any) -> dict[str, Any]:
    import onnx

    tensor = value.type.tensor_type
    shape = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?") for dim in tensor.shape.dim]
    return {"name": value.name, "dtype": onnx.TensorProto.DataType.Name(tensor.elem_type).lower(), "shape": shape}


def _all_graphs(graph: Any) -> Iterator[Any]:
    """``graph`` (or a function) and every subgraph of its nodes (If, Loop, Scan bodies),
    depth first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from _all_graphs(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_graphs(subgraph)


def _all_nodes(graph: Any) -> Iterator[Any]:
    for each in _all_graphs(graph):
        yield from each.node


def run_session(path: Path, feeds: list[dict[str, Any]], provider: str = "CPUExecutionProvider") -> list[list[Any]]:
    """Run ``feeds`` through an onnxruntime session on ``provider``."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=[provider])
    return [session.run(None, feed) for feed in feeds]


def provider_placement(path: Path, provider: str, feed: dict[str, Any]) -> dict[str, Any]:
    """Where onnxruntime actually ran each node when asked for ``provider``.

    A session created for an unavailable provider, or one that rejects the
    graph, silently falls back to the CPU; asking the session and reading its
    profile is the only way to know. Counts are of executed kernels (after
    onnxruntime's own graph fusions).
    """
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if provider not in available:
        return {"provider": provider, "available": False, "available_providers": available, "nodes": {}, "fraction": 0.0}
    with tempfile.TemporaryDirectory() as scratch:
        options = onnxruntime.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(scratch) / "profile")
        providers = [provider] if provider == "CPUExecutionProvider" else [provider, "CPUExecutionProvider"]
        session = onnxruntime.InferenceSession(str(path), options, providers=providers)
        session.run(None, feed)
        profile = Path(session.end_profiling())
        events = json.loads(profile.read_text())
    placed: Counter[str] = Counter()
    for event in events:
        arguments = event.get("args", {})
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time") and "provider" in arguments:
            placed[arguments["provider"]] += 1
    total = sum(placed.values())
    return {
        "provider": provider,
        "available": True,
        "session_providers": session.get_providers(),
        "nodes": dict(placed),
        "fraction": placed[provider] / total if total else 0.0,
    }


def initializer_arrays(model: Any) -> dict[str, Any]:
    """name -> numpy array of every initializer of a loaded model (external data included)."""
    from onnx import numpy_helper

    return {initializer.name: numpy_helper.to_array(initializer) for initializer in model.graph.initializer}


def replace_with_blocked_fp8(
    model: Any,
    initializer_name: str,
    codes: Any,
    scales: Any,
    axis: int,
    block_size: int,
    output_dtype: int | None = None,
) -> None:
    """Replace initializer ``initializer_name`` by FLOAT8E4M3FNUZ ``codes`` and a blocked
    ``DequantizeLinear`` (opset 21) whose output keeps the initializer's name, so
    every consumer is untouched. ``codes`` is a uint8 array of float8_e4m3fnuz bit
    patterns in the initializer's layout; ``scales`` has the same shape except
    ``ceil(dim / block_size)`` along ``axis``. With ``output_dtype`` (e.g. float16)
    a ``Cast`` follows the dequantization.
    """
    import numpy
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    index = next((i for i, item in enumerate(graph.initializer) if item.name == initializer_name), None)
    if index is None:
        raise KeyError(initializer_name)
    del graph.initializer[index]
    codes_name, scale_name = f"{initializer_name}_f143", f"{initializer_name}_f143_scale"
    packed = helper.make_tensor(codes_name, TensorProto.FLOAT8E4M3FNUZ, list(codes.shape), numpy.ascontiguousarray(codes, dtype=numpy.uint8).tobytes(), raw=True)
    graph.initializer.extend([packed, numpy_helper.from_array(numpy.ascontiguousarray(scales, dtype=numpy.float32), scale_name)])
    dequantized = initializer_name if output_dtype is None else f"{initializer_name}_f143_dequantized"
    nodes = [
        helper.make_node(
            "DequantizeLinear", [codes_name, scale_name], [dequantized], name=f"{initializer_name}_DequantizeLinear",
            axis=axis, block_size=block_size,
        )
    ]
    if output_dtype is not None:
        nodes.append(helper.make_node("Cast", [dequantized], [initializer_name], name=f"{initializer_name}_Cast", to=output_dtype))
    # Topological order: the new nodes have only initializer inputs, so they go first.
    for position, node in enumerate(nodes):
        graph.node.insert(position, node)


def save_with_external_data(model: Any, path: Path) -> None:
    """Save ``model`` with its weights in one ``<name>.data`` file beside it (replacing any
    old one). Tensors under 1 KiB stay inline: onnxruntime's shape inference cannot read
    a ``Split``'s sizes from external data.

    The same file as ``onnx.save(..., save_as_external_data=True, location=...)`` writes,
    without its check that no file of the data file's name exists: onnx makes that check
    relative to the *working directory*, not the model's, so a project holding a
    ``model.onnx.data`` of its own where doit runs could not build."""
    import onnx

    weights = path.with_name(path.name + ".data")
    if weights.exists():
        weights.unlink()
    _mark_external(model, weights.name, size_threshold=1024)
    onnx.save_model(model, str(path))


def _initializers(model: Any) -> Iterator[Any]:
    """Every initializer of the model's graph and its subgraphs (what onnx moves to
    external data by default)."""
    for graph in _all_graphs(model.graph):
        yield from graph.initializer


def _all_tensors(model: Any) -> Iterator[Any]:
    """Every tensor a model holds: initializers, and the tensors of node attributes
    (``Constant`` values) in its graphs and functions, which onnxruntime's quantizer
    also moves to external data (``convert_attribute=True``)."""
    yield from _initializers(model)
    # A function has nodes as a graph does, and its nodes' subgraphs are walked alike.
    for node in (node for root in (model.graph, *model.functions) for node in _all_nodes(root)):
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors


def _mark_external(model: Any, location: str, size_threshold: int) -> None:
    """Point every initializer of at least ``size_threshold`` bytes at ``location``: what
    onnx's ``convert_model_to_external_data`` does (its size test included); the next
    ``onnx.save_model`` writes their data there, beside the model."""
    import sys

    from onnx.external_data_helper import set_external_data

    for tensor in _initializers(model):
        if tensor.HasField("raw_data") and sys.getsizeof(tensor.raw_data) >= size_threshold:
            set_external_data(tensor, location)


def relocate_external_data(source: Path, target: Path) -> None:
    """Move the graph ``source`` and its ``<source>.data`` to ``target`` and
    ``<target>.data``, the tensors pointing at the new data file; the bytes are those a
    save straight to ``target`` writes. (onnxruntime's quantizer names a graph's data file
    after the graph and checks that name in the working directory: it writes under a
    name no other file has, and this gives the graph its real one.)"""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    old, new = source.name + ".data", target.name + ".data"
    for tensor in _all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    onnx.save_model(model, str(target))
    if source.with_name(old).exists():  # a graph with no tensor over the size threshold has none
        os.replace(source.with_name(old), target.with_name(new))
    source.unlink()


def blocked_fp8_weights(model: Any) -> dict[str, dict[str, Any]]:
    """Every ``DequantizeLinear`` fed by a FLOAT8E4M3FNUZ initializer, keyed by the name of
    the initializer it replaced: its decoded float32 weight (codes x scales, computed
    here with numpy, independently of onnxruntime)."""
    import numpy
    from onnx import TensorProto, numpy_helper

    initializers = {item.name: item for item in model.graph.initializer}
    found = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in initializers:
            continue
        codes = initializers[node.input[0]]
        if codes.data_type != TensorProto.FLOAT8E4M3FNUZ:
            continue
        attributes = {attribute.name: attribute.i for attribute in node.attribute}
        axis, block = attributes.get("axis", 1), attributes.get("block_size", 0)
        values = numpy_helper.to_array(codes).astype(numpy.float32)
        scales = numpy_helper.to_array(initializers[node.input[1]]).astype(numpy.float32)
        expanded = numpy.repeat(scales, block, axis=axis).take(range(values.shape[axis]), axis=axis) if block else scales
        found[node.input[0].removesuffix("_f143")] = {
            "codes": node.input[0],
            "decoded": values * expanded,
            "axis": axis,
            "block_size": block,
            "code_bytes": values.size,
            "scale_bytes": scales.size * 4,
        }
    return found
