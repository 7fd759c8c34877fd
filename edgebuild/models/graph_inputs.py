"""A graph's inputs from files the manifest names, for calibration and verification:
images through the checkpoint's own image processor into its ``pixel_values``, and
tensors from SafeTensors files, one feed (``{input name: array}``) per run of the
fixed-shape graph. Shared by the kinds that calibrate or judge a graph on them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from edgebuild.core.inputs import expand_inputs
from edgebuild.core.kind import InputFiles
from edgebuild.errors import CheckpointError

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint

PIXEL_INPUT = "pixel_values"


class GraphInputs(InputFiles):
    """Inputs of the graph: images (paths or globs, relative to the manifest) run through
    the source checkpoint's own image processor into its ``pixel_values`` (resized to
    the graph's height and width), and/or SafeTensors files holding one tensor per graph
    input, named as the input, of shape ``[n * batch, ...]`` or ``[n, batch, ...]``."""

    images: list[str] = Field(default_factory=list, description="Images (paths or globs) for the graph's pixel input.")
    tensors: list[str] = Field(
        default_factory=list,
        description="SafeTensors files, one tensor per graph input, named as the input.",
    )


_NUMPY_DTYPES = {"float32": "float32", "float16": "float16", "int64": "int64", "int32": "int32", "bool": "bool"}


def graph_feeds(inputs: GraphInputs, root: Path, checkpoint: "Checkpoint", signature: dict[str, Any],
                what: str) -> list[dict[str, Any]]:
    """Every feed the inputs make for a graph whose inputs are ``signature`` (name ->
    ``{shape, dtype}``): the tensors files' first, then the images'. An input that neither
    gives is an error naming it."""
    feeds = []
    for path in expand_inputs(inputs.tensors, root, f"{what}.tensors"):
        feeds += _tensor_feeds(path, signature)
    images = expand_inputs(inputs.images, root, f"{what}.images")
    if images:
        if PIXEL_INPUT not in signature or len(signature[PIXEL_INPUT]["shape"]) != 4:
            raise CheckpointError(f"{what}.images: the graph has no {PIXEL_INPUT} input of shape [batch, channels, height, "
                                  f"width] to feed them into (its inputs: {', '.join(signature)})")
        others = [name for name in signature if name != PIXEL_INPUT]
        if others:
            raise CheckpointError(f"{what}.images: the graph also takes {', '.join(others)}; give its inputs as tensors files")
        from edgebuild.models.hf import pixel_batches

        dtype = _NUMPY_DTYPES[signature[PIXEL_INPUT]["dtype"]]
        feeds += [{PIXEL_INPUT: batch.numpy().astype(dtype)}
                  for batch in pixel_batches(checkpoint, images, signature[PIXEL_INPUT]["shape"])]
    if not feeds:
        raise CheckpointError(f"{what}: the inputs make no full batch of the graph's {signature}")
    return feeds


def _tensor_feeds(path: Path, signature: dict[str, Any]) -> list[dict[str, Any]]:
    from safetensors import safe_open

    from edgebuild.core.checkpoint import read_header

    header, _ = read_header(path)
    missing = [name for name in signature if name not in header]
    if missing:
        found = ", ".join(name for name in header if name != "__metadata__") or "none"
        raise CheckpointError(f"{path}: no tensor {missing[0]!r} for the graph's input of that name (found {found})")
    columns = {}
    with safe_open(str(path), framework="numpy") as handle:
        for name, spec in signature.items():
            columns[name] = _samples(path, name, handle.get_tensor(name), spec)
    counts = {name: len(samples) for name, samples in columns.items()}
    if len(set(counts.values())) != 1:
        raise CheckpointError(f"{path}: the tensors hold different numbers of samples ({counts})")
    return [{name: samples[index] for name, samples in columns.items()} for index in range(next(iter(counts.values())))]


def _samples(path: Path, name: str, value: Any, spec: dict[str, Any]) -> list[Any]:
    shape = list(spec["shape"])
    dtype = _NUMPY_DTYPES[spec["dtype"]]
    if list(value.shape[1:]) == shape:
        stacked = value
    elif list(value.shape[1:]) == shape[1:] and value.shape[0] % shape[0] == 0:
        stacked = value.reshape(-1, *shape)
    else:
        raise CheckpointError(f"{path}: tensor {name!r}: expected shape [n * {shape[0]}, {', '.join(map(str, shape[1:]))}] "
                              f"or [n, {', '.join(map(str, shape))}], found {list(value.shape)}")
    return [sample.astype(dtype) for sample in stacked]
