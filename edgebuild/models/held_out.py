"""Held-out inputs of any model, as feeds: tensors files (SafeTensors, NumPy ``.npz`` and,
for a model of one input, ``.npy``) and text files through the checkpoint's own
tokenizer. What a text or audio model is judged on instead of random ids (images go
through ``edgebuild/models/hf.py``'s image processor).

Verification only: nothing a build reads. The tokenizer's files are read through
``Checkpoint.file`` and named by ``models.inputs.tokenizer_files``, so the fingerprint
covers them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.core.files import UnreadableFile, read_text
from edgebuild.core.inputs import expand_inputs
from edgebuild.core.runner import Feed, TensorSpec
from edgebuild.errors import CheckpointError
from edgebuild.models.graph_inputs import _NUMPY_DTYPES, _samples, _tensor_feeds
from edgebuild.models.inputs import TOKENIZER_FILES, tokenizer_files

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.models.inputs import HeldOut

# What a tokenizer gives, by the input names transformers' text models take.
TOKENIZER_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# The most text a held-out file may hold: a list of sentences, never a corpus.
TEXT_BYTES = 16 << 20


def held_out_feeds(held_out: "HeldOut", root: Path, checkpoint: "Checkpoint", specs: list[TensorSpec],
                   what: str = "held_out") -> tuple[list[Feed], list[str]]:
    """The feeds ``held_out``'s tensors and texts make for a model whose inputs are
    ``specs`` (fixed shapes), and what they are in words (``["4 batches of held-out
    texts"]``); nothing for images (the image processor's). :class:`CheckpointError`
    naming the file and what was expected, for a file that does not fit."""
    feeds: list[Feed] = []
    said = []
    signature = {spec.name: {"shape": list(spec.shape), "dtype": spec.dtype} for spec in specs}
    unknown = sorted({spec.dtype for spec in specs} - set(_NUMPY_DTYPES))
    if unknown and (held_out.tensors or held_out.texts):
        raise CheckpointError(f"{what}: inputs of dtype {', '.join(unknown)} cannot be read from files")
    found = []
    for path in expand_inputs(held_out.tensors, root, f"{what}.tensors"):
        found += _file_feeds(path, signature)
    if found:
        feeds += found
        said.append(f"{len(found)} batches of held-out tensors")
    texts = expand_inputs(held_out.texts, root, f"{what}.texts")
    if texts:
        made = text_feeds(texts, checkpoint, specs, f"{what}.texts")
        feeds += made
        said.append(f"{len(made)} batches of held-out texts")
    return feeds, said


def _file_feeds(path: Path, signature: dict[str, Any]) -> list[Feed]:
    """One file's feeds: SafeTensors and ``.npz`` by input name, ``.npy`` for one input."""
    if path.suffix not in (".npy", ".npz"):
        return _tensor_feeds(path, signature)
    import numpy

    try:
        # No pickles: a tensors file holds numbers, never code.
        loaded = numpy.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a NumPy {path.suffix} file ({error})") from None
    if path.suffix == ".npy":
        if len(signature) != 1:
            raise CheckpointError(f"{path}: a .npy file holds one array, and the model takes {len(signature)} inputs "
                                  f"({', '.join(signature)}); give an .npz or SafeTensors file with one array per input")
        arrays = {next(iter(signature)): loaded}
    else:
        with loaded:
            arrays = {name: loaded[name] for name in loaded.files}
    missing = [name for name in signature if name not in arrays]
    if missing:
        raise CheckpointError(f"{path}: no array {missing[0]!r} for the model's input of that name "
                              f"(found {', '.join(arrays) or 'none'})")
    columns = {name: _samples(path, name, arrays[name], spec) for name, spec in signature.items()}
    counts = {name: len(samples) for name, samples in columns.items()}
    if len(set(counts.values())) != 1:
        raise CheckpointError(f"{path}: the arrays hold different numbers of samples ({counts})")
    return [{name: samples[index] for name, samples in columns.items()} for index in range(next(iter(counts.values())))]


def text_feeds(paths: list[Path], checkpoint: "Checkpoint", specs: list[TensorSpec], what: str) -> list[Feed]:
    """Every non-empty line of the files through the checkpoint's own tokenizer, padded or
    cut to the inputs' sequence length, in batches of their batch size (a last batch that
    is not full is dropped, as images' are)."""
    import numpy

    by_name = {spec.name: spec for spec in specs}
    others = [name for name in by_name if name not in TOKENIZER_INPUTS]
    if "input_ids" not in by_name or others:
        raise CheckpointError(f"{what}: texts go through a tokenizer into input_ids (and attention_mask, "
                              f"token_type_ids); the model takes {', '.join(by_name)}")
    shape = by_name["input_ids"].shape
    if len(shape) != 2 or any(dim is None for dim in shape):
        raise CheckpointError(f"{what}: input_ids must have a fixed shape [batch, length] to take texts")
    batch, length = shape
    lines = [line.strip() for path in paths for line in _text(path).splitlines() if line.strip()]
    tokenizer = _tokenizer(checkpoint, what)
    try:
        encoded = tokenizer(lines, padding="max_length", truncation=True, max_length=length, return_tensors="np")
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"{what}: the checkpoint's tokenizer refused the texts ({error})") from None
    feeds = []
    for start in range(0, len(lines) - batch + 1, batch):
        feed = {}
        for name, spec in by_name.items():
            if name not in encoded:
                raise CheckpointError(f"{what}: the checkpoint's tokenizer gives no {name} "
                                      f"(it gives {', '.join(encoded)})")
            feed[name] = numpy.ascontiguousarray(encoded[name][start:start + batch]).astype(_NUMPY_DTYPES[spec.dtype])
        feeds.append(feed)
    if not feeds:
        raise CheckpointError(f"{what}: {len(lines)} lines of text, fewer than one batch of {batch}")
    return feeds


def _text(path: Path) -> str:
    try:
        return read_text(path, TEXT_BYTES)
    except (OSError, UnreadableFile) as error:
        raise CheckpointError(f"{path}: not a text file to read ({error})") from None


def _tokenizer(checkpoint: "Checkpoint", what: str) -> Any:
    """The checkpoint's own tokenizer, from its files alone (no hub look-up)."""
    from edgebuild.models.hf import quiet_transformers

    files = tokenizer_files(checkpoint)
    if not files:
        raise CheckpointError(f"{what}: {checkpoint.label} has no tokenizer ({' or '.join(TOKENIZER_FILES[:2])}); "
                              "give tensors files instead")
    for name in files:
        # Read through the checkpoint, so the fingerprint's record of files read holds them.
        checkpoint.file(name)
    with quiet_transformers():
        import transformers

        try:
            return transformers.AutoTokenizer.from_pretrained(str(checkpoint.directory), local_files_only=True)
        except (OSError, ValueError, KeyError) as error:
            raise CheckpointError(f"{what}: the tokenizer of {checkpoint.label} cannot be loaded ({error})") from None
