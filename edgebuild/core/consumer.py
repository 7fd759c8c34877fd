"""``consumer.json``: what a deployment job needs to feed a built artifact, written
beside its outputs by every build (so it travels with them through the store, the
remote cache, ``doit publish`` and ``fetch``).

    {"format": 1,
     "graphs": {"model.onnx": {"inputs": [{"name", "dtype", "shape"}], "outputs": [...]}},
     "image_processor": {"checkpoint": "qwen", "file": "preprocessor_config.json",
                         "config": {...the file's JSON...}},
     "preprocessing": {...what the kind adds...}}

``graphs``: every ONNX graph among the outputs, its inputs (initializers left out)
and outputs as the graph declares them: element type as a NumPy dtype name, each
dimension a number, or the name of a symbolic one. ``image_processor``: the
checkpoint's ``preprocessor_config.json`` (how an image becomes the graph's input:
for a Qwen3.5 tower, ``Qwen2VLImageProcessor``'s settings, whose ``pixel_values``
are the tower's ``patches``) -- only when the artifact's fingerprint covers that
file (its kind's ``TensorSelection.files``), so every byte here is a function of the
fingerprint; absent otherwise. ``preprocessing``: what the kind says a consumer must
do besides (``ArtifactKind.consumer_preprocessing``: for a tower, the image size its
fixed shapes were exported at, and the processor's ``size`` that keeps an image of
that size as it is). An artifact made from a source carries the source's
``image_processor`` and ``preprocessing`` where it has none of its own. A kind that
writes ``consumer.json`` itself keeps its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.core.files import UnreadableFile, read_json

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.core.kind import ArtifactKind, ArtifactParams, TensorSelection

CONSUMER_FILE = "consumer.json"
CONSUMER_FORMAT = 1
PREPROCESSOR_FILE = "preprocessor_config.json"
# A preprocessor configuration is a few kilobytes; read no more than this.
PREPROCESSOR_BYTES = 1 << 20


def fingerprinted_selections(kind: "ArtifactKind", params: "ArtifactParams",
                             checkpoints: dict[str, "Checkpoint"]) -> dict[str, tuple["Checkpoint", "TensorSelection | None"]]:
    """What the artifact's fingerprint covers of each checkpoint, as ``BuildGraph`` takes it:
    its own checkpoints, or (with none) those behind its sources."""
    own = [name for name in params.checkpoint_names() if name in checkpoints]
    return {name: (checkpoints[name], kind.tensor_selection(params, checkpoints[name])) for name in own or sorted(checkpoints)}


def write_consumer_contract(out_dir: Path, kind: "ArtifactKind", params: "ArtifactParams",
                            checkpoints: dict[str, "Checkpoint"], sources: dict[str, Path] | None = None) -> None:
    """Write ``consumer.json`` into the build's scratch directory ``out_dir`` (unless the
    kind wrote one), from the outputs there, the checkpoints' fingerprinted files and the
    kind's ``consumer_preprocessing``; an artifact made from a source, that reads no image
    processor itself, carries its source's ``image_processor`` and ``preprocessing`` (the
    QNN context of a QDQ graph is what a deployment feeds images to)."""
    target = out_dir / CONSUMER_FILE
    if target.exists():
        return
    selections = fingerprinted_selections(kind, params, checkpoints)
    contract: dict[str, Any] = {"format": CONSUMER_FORMAT}
    graphs = {relative: graph_signature(out_dir / relative)
              for relative in sorted(path.relative_to(out_dir).as_posix() for path in out_dir.rglob("*.onnx"))}
    if graphs:
        contract["graphs"] = graphs
    for name, (checkpoint, selection) in sorted(selections.items()):
        if selection is not None and PREPROCESSOR_FILE in selection.files:
            path = checkpoint.file(PREPROCESSOR_FILE)
            try:
                config = read_json(path, PREPROCESSOR_BYTES)
            except (OSError, UnreadableFile):
                # The kind's own checks name a bad file; the contract simply goes without it.
                continue
            contract["image_processor"] = {"checkpoint": name, "file": PREPROCESSOR_FILE, "config": config}
            break
    preprocessing = kind.consumer_preprocessing(params)
    if preprocessing:
        contract["preprocessing"] = preprocessing
    for source in (sources or {}).values():
        # The source's contract is one of its outputs: its bytes are in this artifact's fingerprint.
        try:
            inherited = read_json(source / CONSUMER_FILE, PREPROCESSOR_BYTES)
        except (OSError, UnreadableFile):
            continue
        if isinstance(inherited, dict):
            for key in ("image_processor", "preprocessing"):
                if key not in contract and key in inherited:
                    contract[key] = inherited[key]
    target.write_text(json.dumps(contract, indent=2, sort_keys=True) + "\n")


def graph_signature(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The inputs (initializers left out) and outputs of the ONNX graph at ``path``, read
    without its external data."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    model = onnx.load(str(path), load_external_data=False)
    initializers = {initializer.name for initializer in model.graph.initializer}

    def described(values: Any) -> list[dict[str, Any]]:
        found = []
        for value in values:
            if value.name in initializers or not value.type.HasField("tensor_type"):
                continue
            tensor = value.type.tensor_type
            shape = [dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in tensor.shape.dim]
            found.append({"name": value.name, "dtype": str(tensor_dtype_to_np_dtype(tensor.elem_type)), "shape": shape})
        return found

    return {"inputs": described(model.graph.input), "outputs": described(model.graph.output)}
