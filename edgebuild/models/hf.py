"""transformers as the kinds use it: quiet calls, a checkpoint's own image processor,
``from_pretrained`` that refuses a half-loaded model, the model behind a module whose
forward takes a graph's inputs in order and returns the chosen outputs, and its inputs
(seeded random ones, images through the checkpoint's own image processor).

A model description (``params`` below) is anything with a ``model_class``, its
``inputs`` (name -> shape spec), ``outputs``, ``dtype``, ``attn_implementation``,
``tensor_prefixes`` and ``input_dtype(name)``: an ``hf_onnx`` artifact's parameters, or
:class:`~edgebuild.models.fields.ModelFields`.

Everything is read from the checkpoint directory alone (``local_files_only``, no hub
cache consulted), and every file is reached through
:class:`~edgebuild.core.checkpoint.Checkpoint`, so the fingerprint covers it.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from edgebuild.errors import CheckpointError, ExportError, ParameterError

if TYPE_CHECKING:
    from PIL import Image

    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.models.inputs import DynamicInput

PREPROCESSOR_FILE = "preprocessor_config.json"
# What a worker that runs a transformers model or image processor imports first, for
# seconds (the kinds' ``worker_imports``): ``import transformers`` is lazy, these are not.
TRANSFORMERS_IMPORTS = ("transformers.modeling_utils", "transformers.image_processing_utils")


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' advisory output for one call: its warnings (the fast image
    processor wants torchvision, config remarks about unused token ids), its loading
    report, its progress bars."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(previous)
        if bars:
            logging.enable_progress_bar()


def transformers_class(name: str, what: str) -> Any:
    """The class ``name`` of transformers; an :class:`ExportError` with the closest name when
    there is none (``what`` says which setting named it)."""
    import difflib

    import transformers

    found = getattr(transformers, name, None) if name.isidentifier() else None
    if not isinstance(found, type):
        match = difflib.get_close_matches(name, [entry for entry in dir(transformers) if entry[:1].isupper()], n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise ExportError(f"{what}: {name!r} is not a class transformers provides{hint}")
    return found


def check_forward_inputs(model_class: str, inputs: Any) -> None:
    """:class:`ParameterError` (key ``inputs``) for an input name ``model_class``'s
    ``forward`` does not take: a typo (``pixelvalues``) would otherwise end in
    transformers' traceback at the build."""
    import difflib
    import inspect

    try:
        forward = transformers_class(model_class, "model_class").forward
    except ExportError as error:
        raise ParameterError(str(error).removeprefix("model_class: "), key="model_class") from None
    taken = [name for name, parameter in inspect.signature(forward).parameters.items()
             if name != "self" and parameter.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)]
    for name in inputs:
        if name not in taken:
            hint = difflib.get_close_matches(name, taken, n=1)
            raise ParameterError(f"{name!r} is not an input of {model_class}.forward" + (f" (did you mean {hint[0]!r}?)"
                                 if hint else "") + f"; it takes {', '.join(taken)}", key="inputs")


def image_processor(checkpoint: "Checkpoint", default: str) -> Any:
    """The checkpoint's own image processor, from its ``preprocessor_config.json`` alone
    (read through ``Checkpoint.file``, so the fingerprint covers it). transformers'
    ``AutoImageProcessor`` would also consult ``config.json`` and the hub cache.
    ``default``: the class when the file does not name one."""
    import transformers

    path = checkpoint.file(PREPROCESSOR_FILE)
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise CheckpointError(f"{path}: not a JSON object ({error})") from None
    if not isinstance(settings, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(settings).__name__}")
    # The "Fast" processors need torchvision; their slow twins compute the same values.
    name = str(settings.get("image_processor_type", default)).removesuffix("Fast")
    # The plain name picks a torchvision backend where torchvision is installed and the
    # PIL one otherwise (with a warning): the PIL one always, so the pixels, and the
    # artifact's bytes, do not depend on what else a machine has installed.
    with quiet_transformers():
        processor_class = getattr(transformers, f"{name}Pil", None) or getattr(transformers, name, None)
    if processor_class is None or not name.endswith("ImageProcessor"):
        raise CheckpointError(f"{path}: image_processor_type: {name!r} is not an image processor transformers provides")
    try:
        with quiet_transformers():
            return processor_class.from_dict(settings)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: not a valid {name} configuration ({error})") from None


def load_pretrained(model_class: Any, checkpoint: "Checkpoint", **options: Any) -> tuple[Any, set[str]]:
    """``model_class.from_pretrained`` of the checkpoint's directory in float32, strictly:
    a tensor the class needs that the checkpoint lacks, or one of another shape, is a
    :class:`CheckpointError` (a half-loaded model exports cleanly and computes plausible
    garbage). Returns the model and the names of the checkpoint tensors it used."""
    import torch

    with quiet_transformers():
        try:
            model, info = model_class.from_pretrained(
                str(checkpoint.directory), local_files_only=True, output_loading_info=True, dtype=torch.float32,
                use_safetensors=True, **options,
            )
        except (OSError, ValueError, TypeError, KeyError) as error:
            reason = " ".join(str(error).split())
            raise CheckpointError(f"{checkpoint.label}: {model_class.__name__}.from_pretrained failed: {reason}") from None
    for key, what in (("missing_keys", "lacks tensors the class needs"), ("mismatched_keys", "has tensors of another shape")):
        found = sorted(str(entry[0] if isinstance(entry, tuple) else entry) for entry in info.get(key, ()))
        if found:
            shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
            raise CheckpointError(f"{checkpoint.label}: {what} of {model_class.__name__}: {shown}")
    used = set(checkpoint.tensors) - set(info.get("unexpected_keys", ()))
    checkpoint.tensors_read.update(used)
    return model.eval(), used


def pixel_batches(checkpoint: "Checkpoint", images: "list[Path | Image.Image]", shape: list[int],
                  default: str = "CLIPImageProcessor") -> list[Any]:
    """Images (paths, or RGB images already read) as ``pixel_values`` batches of a graph's
    fixed ``shape`` ([batch, channels, height, width]), through the checkpoint's own image
    processor; a last batch that is not full is dropped.

    By the processor's own rules first (its resize, crop and normalisation, exactly as a
    deployment that loads ``preprocessor_config.json`` runs it); where they make another
    size, with its size (and crop size) set to the graph's, in the processor's own terms
    (``height``/``width``, or ``shortest_edge``); failing that, the image resized to the
    graph's height and width with the processor's resampling filter, and the processor
    left to rescale and normalise. Whatever fails inside the processor is one
    :class:`CheckpointError` naming it and its file."""
    import torch

    from edgebuild.ml.images import load_rgb_image

    batch, channels, height, width = shape
    processor = image_processor(checkpoint, default)
    label = f"{type(processor).__name__.removesuffix('Pil')} ({checkpoint.file(PREPROCESSOR_FILE)})"
    attempts = _size_attempts(processor, height, width)
    pixels = []
    for image in images:
        loaded = image if not isinstance(image, Path) else load_rgb_image(image)
        made = []
        for resized, overrides in attempts:
            given = loaded.resize((width, height), resample=processor.resample) if resized else loaded
            made.append(_processed(processor, given, overrides, label))
            if tuple(made[-1].shape[1:]) == (channels, height, width):
                break
        else:
            shapes = " or ".join(dict.fromkeys(str(list(found.shape[1:])) for found in made))
            raise CheckpointError(f"{label}: makes pixel_values of shape {shapes}, not the graph's "
                                  f"[{channels}, {height}, {width}], by its own rules or set to {height}x{width}")
        pixels.append(made[-1])
    stacked = torch.cat(pixels).float() if pixels else torch.zeros(0, channels, height, width)
    return [stacked[index * batch:(index + 1) * batch] for index in range(len(pixels) // batch)]


def _size_attempts(processor: Any, height: int, width: int) -> list[tuple[bool, dict[str, Any]]]:
    """``(resize first, settings)`` to try in order: the processor's own; its size set to
    the graph's in the terms it uses; the image resized first, the processor's resize and
    crop off."""
    size = getattr(processor, "size", None)
    crops = bool(getattr(processor, "do_center_crop", False)) and getattr(processor, "crop_size", None) is not None
    set_size: dict[str, Any] = {}
    if getattr(size, "height", None) is not None and getattr(size, "width", None) is not None:
        set_size = {"size": {"height": height, "width": width}}
    elif getattr(size, "shortest_edge", None) is not None:
        set_size = {"size": {"shortest_edge": min(height, width)}}
    if set_size and crops:
        set_size["crop_size"] = {"height": height, "width": width}
    attempts: list[tuple[bool, dict[str, Any]]] = [(False, {})]
    if set_size:
        attempts.append((False, set_size))
    attempts.append((True, {"do_resize": False, "do_center_crop": False}))
    return attempts


def _processed(processor: Any, image: Any, overrides: dict[str, Any], label: str) -> Any:
    """``processor(images=[image], **overrides)``'s ``pixel_values``, or one line naming the processor."""
    with quiet_transformers():
        try:
            return processor(images=[image], return_tensors="pt", **overrides)["pixel_values"]
        except Exception as error:  # a processor raises what its own code does (AttributeError, KeyError, ...)
            reason = " ".join(str(error).split())[:300]
            raise CheckpointError(f"{label}: cannot process an image: {type(error).__name__}: {reason}") from None


def load_model(params: Any, checkpoint: "Checkpoint") -> Any:
    """``params.model_class`` from the checkpoint, float32, strictly; with
    ``tensor_prefixes``, an error if the class reads a tensor outside them."""
    model_class = transformers_class(params.model_class, "model_class")
    options = {"attn_implementation": params.attn_implementation} if params.attn_implementation else {}
    model, used = load_pretrained(model_class, checkpoint, **options)
    if params.tensor_prefixes is not None:
        outside = sorted(name for name in used if not name.startswith(tuple(params.tensor_prefixes)))
        if outside:
            shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
            raise ExportError(
                f"{params.model_class} reads {shown} from {checkpoint.label}, outside tensor_prefixes "
                f"{params.tensor_prefixes}: add its prefix, or the fingerprint would not cover it"
            )
    return model


def outputs_module(model: Any, params: Any) -> Any:
    """A module whose forward takes the inputs in the manifest's order (positionally: the
    graph's inputs) and returns ``params.outputs`` of the model's output, as a tuple."""
    return named_outputs_module(model, list(params.inputs), list(params.outputs))


def named_outputs_module(model: Any, names: list[str], outputs: list[str]) -> Any:
    """``model`` called with ``names`` as keywords, from positional tensors, returning the
    fields ``outputs`` of its output as a tuple."""
    import torch

    class Outputs(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *tensors: Any) -> tuple[Any, ...]:
            result = self.inner(**dict(zip(names, tensors)))
            return tuple(result[name] for name in outputs)

    return Outputs(model).eval()


def check_outputs(model: Any, params: Any, example: tuple[Any, ...]) -> dict[str, list[int]]:
    """Run the model once: every output named exists (else one line naming what it has);
    return each output's shape."""
    import torch

    try:
        with torch.no_grad():
            result = model(**dict(zip(params.inputs, example)))
    except (TypeError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())
        raise ExportError(f"{params.model_class}.forward refused the inputs {list(params.inputs)}: {reason}") from None
    available = [key for key in result.keys() if result[key] is not None]
    missing = [name for name in params.outputs if name not in available]
    if missing:
        raise ExportError(
            f"outputs: {params.model_class} returns no {missing[0]!r}; it returns {', '.join(available)}"
        )
    return {name: list(result[name].shape) for name in params.outputs}


def dynamic_shapes(inputs: "dict[str, DynamicInput] | None") -> tuple[Any, ...] | None:
    """``torch.export``'s (and so torch's ONNX exporter's) dynamic shapes for the module's
    positional inputs (:func:`named_outputs_module`: one argument, ``*tensors``): a ``Dim``
    per dynamic axis, between its sizes; ``None`` when every shape is fixed."""
    from torch.export import Dim

    if not any(spec.dynamic for spec in (inputs or {}).values()):
        return None
    assert inputs is not None
    return (tuple({axis: Dim(f"{name}_{axis}", min=low, max=high) for axis, (low, high) in spec.dynamic.items()}
                  or None for name, spec in inputs.items()),)


def at_each_size(params: Any) -> list[Any]:
    """The parameters at each size a graph is checked at: every dynamic axis at its
    smallest, then at its largest size; the parameters alone when nothing is dynamic."""
    if not params.dynamic:
        return [params]
    return [params.model_copy(update={"inputs": {name: spec.model_copy(update={"shape": spec.at(size)})
                                                 for name, spec in params.inputs.items()}})
            for size in ("smallest", "largest")]


def random_inputs(params: Any, config: Any, count: int, seed: int) -> list[tuple[Any, ...]]:
    """``count`` tuples of inputs at the fixed shapes, by the one seeded rule
    (:func:`~edgebuild.core.runner.random_feeds`; token ids below the config's vocabulary)."""
    import torch

    from edgebuild.core.runner import TensorSpec, random_feeds

    specs = [TensorSpec(name, tuple(spec.shape), params.input_dtype(name)) for name, spec in params.inputs.items()]
    vocabulary = int(getattr(config, "vocab_size", None) or 0) or None
    return [tuple(torch.from_numpy(feed[spec.name]) for spec in specs)
            for feed in random_feeds(specs, count, seed, vocabulary)]


def image_inputs(params: Any, checkpoint: "Checkpoint", images: list[Any]) -> list[tuple[Any, ...]]:
    """Images (paths, or RGB images read) as ``pixel_values`` batches of the graph's fixed
    shape (through the checkpoint's own image processor); the other inputs as
    :func:`random_inputs` gives them."""
    import torch

    
    batches = pixel_batches(checkpoint, images, params.inputs["pixel_values"].shape)
    dtype = getattr(torch, params.input_dtype("pixel_values"))
    others = random_inputs(params, checkpoint_config(checkpoint), len(batches), 0)
    position = list(params.inputs).index("pixel_values")
    samples = []
    for pixels, other in zip(batches, others):
        sample = list(other)
        sample[position] = pixels.to(dtype)
        samples.append(tuple(sample))
    return samples


def checkpoint_config(checkpoint: "Checkpoint") -> Any:
    """The checkpoint's ``config.json`` as an object with attributes (vocab_size, ...)."""
    from types import SimpleNamespace

    return SimpleNamespace(**checkpoint.config)
