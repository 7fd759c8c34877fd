"""``torch.export`` programs as build outputs. The format every target that lowers a
model takes (``formats.TORCH_PROGRAM``: ``program.pt2`` and ``export.json``, what goes
in and comes out), saved so that the same program is the same bytes in any checkout,
and loaded back for the targets that lower from them.

``torch.export.save`` writes two things that differ between two saves of one program: a
random ``serialization_id`` record in its archive, and every node's ``stack_trace`` (the
source files' paths and lines of the code that was traced). The traces are dropped
before saving (the module names and fx node names stay, for debugging); the id is
written as zeros in place, its CRC fixed, the archive's layout untouched (its weights
stay aligned where the loader expects them).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.core.runner import Feed, Inputs, TensorSpec, random_feeds
from edgebuild.targets.formats import PROGRAM_FILE
from edgebuild.targets.formats import PROGRAM_INFO_FILE as INFO_FILE

if TYPE_CHECKING:
    import numpy

SERIALIZATION_ID = ".data/serialization_id"
# What torch.export imports on its first export (the kinds' ``worker_imports``).
PROGRAM_IMPORTS = ("torch.export", "torch._export.serde.serialize")


def strip_stack_traces(program: Any) -> int:
    """Drop every node's ``stack_trace`` metadata; return how many there were."""
    removed = 0
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if node.meta.pop("stack_trace", None) is not None:
                removed += 1
    return removed


def traced_module(node: Any) -> str | None:
    """The model module a program's node was traced in: the innermost entry of its
    ``nn_module_stack``, relative to the model (a wrapper of edgebuild's own around the
    model, the stack's first class, is left out); ``None`` for the wrapper's own nodes."""
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    module = stack[-1][0] if stack else None
    if len(stack) >= 2 and str(stack[0][1]).startswith("edgebuild.") and module is not None:
        wrapper = stack[1][0]
        module = None if module == wrapper else module.removeprefix(f"{wrapper}.")
    return module or None


def traced_modules(graph_module: Any) -> dict[str, str]:
    """Each call node of a program's ``graph_module`` traced in a model module -> that
    module, by the node's name (the name lowerings keep: OpenVINO's ops are
    ``<node>/<aten op>/...``)."""
    return {node.name: module for node in graph_module.graph.nodes
            if node.op == "call_function" and (module := traced_module(node)) is not None}


def save_program(program: Any, path: Path) -> None:
    """``torch.export.save`` of ``program`` at ``path``, the same bytes for the same program."""
    import torch

    strip_stack_traces(program)
    torch.export.save(program, str(path))
    _zero_serialization_id(path)


def load_program(path: Path) -> Any:
    import torch

    return torch.export.load(str(path))


def _zero_serialization_id(path: Path) -> None:
    """Write the archive's random serialization id as zeros, in place: its bytes, and its
    CRC in the local header, the data descriptor (if any) and the central directory."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entries = [entry for entry in archive.infolist() if entry.filename.endswith(SERIALIZATION_ID)]
        # Where the central directory starts: it runs to the end (kilobytes; the weights are before it).
        directory_start = archive.start_dir  # type: ignore[attr-defined]
    if not entries:
        return
    (entry,) = entries
    if entry.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"{path}: {entry.filename} is compressed; expected torch's stored archive")
    zeros = b"0" * entry.file_size
    crc = struct.pack("<I", zlib.crc32(zeros) & 0xFFFFFFFF)
    with open(path, "r+b") as handle:
        handle.seek(entry.header_offset)
        header = handle.read(30)
        if header[:4] != b"PK\x03\x04":
            raise ValueError(f"{path}: no local header for {entry.filename}")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = entry.header_offset + 30 + name_length + extra_length
        handle.seek(entry.header_offset + 14)
        handle.write(crc)
        handle.seek(start)
        handle.write(zeros)
        if entry.flag_bits & 0x08:
            # A data descriptor after the data: an optional signature, then the CRC.
            handle.seek(start + entry.compress_size)
            signature = handle.read(4)
            handle.seek(start + entry.compress_size + (4 if signature == b"PK\x07\x08" else 0))
            handle.write(crc)
        handle.seek(directory_start)
        data = handle.read()
        position = 0
        while data[position:position + 4] == b"PK\x01\x02":
            name_length, extra_length, comment_length = struct.unpack("<HHH", data[position + 28:position + 34])
            if data[position + 46:position + 46 + name_length].decode() == entry.filename:
                handle.seek(directory_start + position + 16)
                handle.write(crc)
                break
            position += 46 + name_length + extra_length + comment_length


# --- what a program says of itself (``export.json``) -----------------------------------------


def program_info(source: Path) -> dict[str, Any]:
    """A program's ``export.json``: its inputs (with their dynamic axes) and outputs."""
    from edgebuild.core.files import RECORD_BYTES, read_json

    return read_json(source / INFO_FILE, RECORD_BYTES)


def program_path(source: Path) -> Path:
    return source / PROGRAM_FILE


def input_specs(info: dict[str, Any]) -> list[TensorSpec]:
    """The program's inputs, a dynamic axis left open."""
    return [TensorSpec(spec["name"], tuple(None if str(axis) in spec["dynamic"] else dim
                                           for axis, dim in enumerate(spec["shape"])), spec["dtype"])
            for spec in info["inputs"]]


def program_signature(source: Path) -> dict[str, list[dict[str, Any]]]:
    """What the program in the directory ``source`` takes and gives, in ``consumer.json``'s
    terms (``programs``): name, dtype (a float input at the program's own ``dtype``), shape,
    a dynamic axis ``None`` (:func:`dynamic_axes`); from its ``export.json``."""
    info = program_info(source)
    dynamic = dynamic_axes(source, info)
    float_dtype = info.get("dtype", "float32")

    def described(specs: list[dict[str, Any]], open_axes: list[set[int]]) -> list[dict[str, Any]]:
        return [{"name": spec["name"], "dtype": float_dtype if spec["dtype"].startswith("float") else spec["dtype"],
                 "shape": [None if axis in axes else dim for axis, dim in enumerate(spec["shape"])]}
                for spec, axes in zip(specs, open_axes)]

    return {"inputs": described(info["inputs"], dynamic["inputs"]),
            "outputs": described(info["outputs"], dynamic["outputs"])}


def dynamic_axes(source: Path, info: dict[str, Any]) -> dict[str, list[set[int]]]:
    """The dynamic axes of each input (``export.json``) and each output of the program in
    ``source``: an output's, from the program's own traced shapes (a symbol where it follows
    a dynamic input), loaded only for a program with a dynamic input."""
    inputs = [{int(axis) for axis in spec["dynamic"]} for spec in info["inputs"]]
    if not any(inputs):
        return {"inputs": inputs, "outputs": [set() for _ in info["outputs"]]}
    from torch.export.graph_signature import OutputKind

    program = load_program(program_path(source))
    nodes = {node.name: node for node in program.graph.nodes}
    returned = [spec.arg.name for spec in program.graph_signature.output_specs if spec.kind == OutputKind.USER_OUTPUT]
    outputs = [{axis for axis, dim in enumerate(nodes[name].meta["val"].shape) if not isinstance(dim, int)}
               for name in returned]
    return {"inputs": inputs, "outputs": outputs}


def output_names(info: dict[str, Any]) -> list[str]:
    return [spec["name"] for spec in info["outputs"]]


def sizes(info: dict[str, Any]) -> list[dict[str, list[int]]]:
    """The input shapes a target is checked at: every dynamic axis at its smallest, then at
    its largest size (the given shapes when nothing is dynamic)."""
    dynamic = any(spec["dynamic"] for spec in info["inputs"])
    found = []
    for end in (0, 1) if dynamic else (None,):
        shapes = {}
        for spec in info["inputs"]:
            shape = list(spec["shape"])
            for axis, bounds in spec["dynamic"].items():
                shape[int(axis)] = bounds[end] if end is not None else shape[int(axis)]
            shapes[spec["name"]] = shape
        found.append(shapes)
    return found


def program_feeds(info: dict[str, Any], count: int, seed: int) -> Inputs:
    """``count`` seeded inputs (:func:`~edgebuild.core.runner.random_feeds`) at each size
    (:func:`sizes`), from one generator."""
    import numpy

    generator = numpy.random.default_rng(seed)
    feeds: list[Feed] = []
    for shapes in sizes(info):
        specs = [TensorSpec(spec["name"], tuple(shapes[spec["name"]]), spec["dtype"]) for spec in info["inputs"]]
        feeds += random_feeds(specs, count, generator)
    dynamic = len(sizes(info)) > 1
    return Inputs(feeds, f"{count} random inputs" + (" at the smallest and at the largest dynamic sizes" if dynamic else ""))


def example_arrays(info: dict[str, Any]) -> "list[numpy.ndarray]":
    """One input of the program's (first) shapes, in its input order: what a lowering that
    traces again is given."""
    (feed,) = program_feeds(info, 1, 0).feeds[:1]
    return [feed[spec["name"]] for spec in info["inputs"]]
