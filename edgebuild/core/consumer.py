"""``consumer.json``: what an application needs to feed a built artifact and read what
it gives, written beside its outputs by every build (so it travels with them through
the store, the remote cache, ``doit publish`` and ``fetch``).

    {"format": 1,
     "graphs": {"model.onnx": {"inputs": [{"name", "dtype", "shape"}], "outputs": [...]}},
     "programs": {"model.pte": {"inputs": [{"name", "dtype", "shape"}], "outputs": [...]}},
     "image_processor": {"checkpoint": "qwen", "file": "preprocessor_config.json",
                         "config": {...the file's JSON...}},
     "tokenizer": {"directory": "tokenizer", "files": ["tokenizer.json", ...]},
     "labels": {"id2label": {"0": "negative", "1": "positive"}},
     "preprocessing": {...what the kind adds...}}

``graphs``: every ONNX graph among the outputs, its inputs (initializers left out)
and outputs as the graph declares them: element type as a NumPy dtype name, each
dimension a number, or the name of a symbolic one. ``programs``: every other program
among the outputs, by its path, as its kind describes it for the runtime that runs it
(``ArtifactKind.consumer_programs``): inputs and outputs in the order that runtime
takes and gives them, each named as the model names it (what a tokenizer or an image
processor makes, and the model's outputs), its dtype as the runtime declares it (a
NumPy dtype name: cast to it; ids may be declared ``int32`` where the model takes
``int64``), each dimension a number or ``null`` where it is dynamic; where the
runtime knows a tensor by another name, ``tensor`` gives it. ``image_processor``: the
checkpoint's ``preprocessor_config.json`` (how an image becomes the graph's input:
for a Qwen3.5 tower, ``Qwen2VLImageProcessor``'s settings, whose ``pixel_values``
are the tower's ``patches``) -- only when the artifact's fingerprint covers that
file (its kind's ``TensorSelection.files``), so every byte here is a function of the
fingerprint; absent otherwise. ``tokenizer``: the checkpoint's tokenizer files the
fingerprint covers (a text model's, one that takes ``input_ids``), shipped beside the
outputs in ``directory`` as the checkpoint has them, so that
``AutoTokenizer.from_pretrained(<artifact>/tokenizer)`` (or the ``tokenizers``
library, on ``tokenizer.json``) makes the model's ids. ``labels``: the ``id2label``
of the checkpoint's ``config.json`` (class index, as a string, -> name), when it has
one and the fingerprint covers all of ``config.json``. ``preprocessing``: what the
kind says a consumer must do besides (``ArtifactKind.consumer_preprocessing``: for a
tower, the image size its fixed shapes were exported at, and the processor's
``size`` that keeps an image of that size as it is). An artifact made from a source
carries the source's ``image_processor``, ``tokenizer`` (its files copied),
``labels`` and ``preprocessing`` where it has none of its own. A kind that writes
``consumer.json`` itself keeps its own. Every key but ``format`` is optional: a
reader ignores keys it does not know.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgebuild.core.checkpoint import TOKENIZER_FILES, Checkpoint
from edgebuild.core.files import UnreadableFile, open_regular, read_json

CONSUMER_FILE = "consumer.json"
CONSUMER_FORMAT = 1
PREPROCESSOR_FILE = "preprocessor_config.json"
# A preprocessor configuration is a few kilobytes; read no more than this.
PREPROCESSOR_BYTES = 1 << 20
# Where the tokenizer's files are shipped, beside the outputs.
TOKENIZER_DIRECTORY = "tokenizer"
# What an artifact made from a source takes of the source's contract, where it has none of its own.
INHERITED = ("image_processor", "tokenizer", "labels", "preprocessing")

# The kind, its parameters and a ``TensorSelection`` are typed ``Any`` here: ``core/kind.py``
# imports this module (so that it is in every build digest), and an import back, even for
# annotations, would be a cycle.


def fingerprinted_selections(kind: Any, params: Any,
                             checkpoints: dict[str, Checkpoint]) -> dict[str, tuple[Checkpoint, Any]]:
    """What the artifact's fingerprint covers of each checkpoint, as ``BuildGraph`` takes it:
    its own checkpoints, or (with none) those behind its sources."""
    own = [name for name in params.checkpoint_names() if name in checkpoints]
    return {name: (checkpoints[name], kind.tensor_selection(params, checkpoints[name])) for name in own or sorted(checkpoints)}


def write_consumer_contract(out_dir: Path, kind: Any, params: Any, checkpoints: dict[str, Checkpoint],
                            sources: dict[str, Path] | None = None) -> None:
    """Write ``consumer.json`` into the build's scratch directory ``out_dir`` (unless the
    kind wrote one), from the outputs there, the kind's description of its programs, the
    checkpoints' fingerprinted files and the kind's ``consumer_preprocessing``; an artifact
    made from a source, that reads none of them itself, carries its source's (the QNN
    context of a QDQ graph is what a deployment feeds images to)."""
    target = out_dir / CONSUMER_FILE
    if target.exists():
        return
    sources = sources or {}
    selections = fingerprinted_selections(kind, params, checkpoints)
    own = set(params.checkpoint_names())
    contract: dict[str, Any] = {"format": CONSUMER_FORMAT}
    graphs = {relative: graph_signature(out_dir / relative)
              for relative in sorted(path.relative_to(out_dir).as_posix() for path in out_dir.rglob("*.onnx"))}
    if graphs:
        contract["graphs"] = graphs
    programs = kind.consumer_programs(params, out_dir, sources)
    if programs:
        contract["programs"] = dict(sorted(programs.items()))
    for name, (checkpoint, selection) in sorted(selections.items()):
        if "image_processor" not in contract and selection is not None and PREPROCESSOR_FILE in selection.files:
            config = _checkpoint_json(checkpoint, PREPROCESSOR_FILE)
            if config is not None:
                contract["image_processor"] = {"checkpoint": name, "file": PREPROCESSOR_FILE, "config": config}
        if "tokenizer" not in contract and selection is not None:
            files = [file for file in TOKENIZER_FILES if file in selection.files]
            if files and _ship_tokenizer(out_dir, {file: checkpoint.file(file) for file in files}):
                contract["tokenizer"] = {"directory": TOKENIZER_DIRECTORY, "files": files}
        # config.json is in the fingerprint whole where the selection names no section of it
        # (an own checkpoint the kind reads nothing of: its config alone).
        whole_config = selection.config_key is None if selection is not None else name in own
        labels = checkpoint.config.get("id2label") if whole_config else None
        if "labels" not in contract and isinstance(labels, dict) and labels:
            contract["labels"] = {"id2label": labels}
    preprocessing = kind.consumer_preprocessing(params)
    if preprocessing:
        contract["preprocessing"] = preprocessing
    for source in sources.values():
        # The source's contract is one of its outputs: its bytes are in this artifact's fingerprint.
        try:
            inherited = read_json(source / CONSUMER_FILE, PREPROCESSOR_BYTES)
        except (OSError, UnreadableFile):
            continue
        if not isinstance(inherited, dict):
            continue
        for key in INHERITED:
            if key in contract or key not in inherited:
                continue
            if key == "tokenizer" and not _ship_inherited_tokenizer(out_dir, source, inherited[key]):
                continue
            contract[key] = inherited[key]
    target.write_text(json.dumps(contract, indent=2, sort_keys=True) + "\n")


def _checkpoint_json(checkpoint: Checkpoint, name: str) -> Any:
    try:
        return read_json(checkpoint.file(name), PREPROCESSOR_BYTES)
    except (OSError, UnreadableFile):
        # The kind's own checks name a bad file; the contract simply goes without it.
        return None


def _ship_tokenizer(out_dir: Path, files: dict[str, Path]) -> bool:
    """Copy the tokenizer's ``files`` (name -> path) into ``out_dir/tokenizer``; False (and
    nothing left there) where one cannot be read, or the kind wrote that directory itself."""
    directory = out_dir / TOKENIZER_DIRECTORY
    if directory.exists():
        return False
    directory.mkdir()
    try:
        for name, path in files.items():
            # Read through the checked opener; written into the build's own fresh directory.
            with open_regular(path) as source, (directory / name).open("wb") as copy:
                shutil.copyfileobj(source, copy)
    except (OSError, UnreadableFile):
        shutil.rmtree(directory)
        return False
    return True


def _ship_inherited_tokenizer(out_dir: Path, source: Path, entry: Any) -> bool:
    """The tokenizer a source ships, copied from its directory; False for an entry this
    version does not know the shape of (it is then left out, not half copied)."""
    if not isinstance(entry, dict) or entry.get("directory") != TOKENIZER_DIRECTORY:
        return False
    files = entry.get("files")
    if not isinstance(files, list) or not files or not all(file in TOKENIZER_FILES for file in files):
        return False
    return _ship_tokenizer(out_dir, {file: source / TOKENIZER_DIRECTORY / file for file in files})


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
