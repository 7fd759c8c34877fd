"""transformers as the kinds use it: quiet calls, a checkpoint's own image processor,
and ``from_pretrained`` that refuses a half-loaded model.

Everything is read from the checkpoint directory alone (``local_files_only``, no hub
cache consulted), and every file is reached through
:class:`~edgebuild.core.checkpoint.Checkpoint`, so the fingerprint covers it.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from edgebuild.errors import CheckpointError, ExportError

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint

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


def pixel_batches(checkpoint: "Checkpoint", paths: list[Path], shape: list[int], default: str = "CLIPImageProcessor") -> list[Any]:
    """Images as ``pixel_values`` batches of a graph's fixed ``shape`` ([batch, channels,
    height, width]), through the checkpoint's own image processor resized to that height
    and width; a last batch that is not full is dropped."""
    from edgebuild.ml.images import load_rgb_image

    batch, channels, height, width = shape
    processor = image_processor(checkpoint, default)
    with quiet_transformers():
        try:
            pixels = processor(images=[load_rgb_image(path) for path in paths], return_tensors="pt",
                               size={"height": height, "width": width}, do_center_crop=False)["pixel_values"]
        except (TypeError, ValueError) as error:
            reason = " ".join(str(error).split())
            raise CheckpointError(f"{checkpoint.label}: its image processor cannot make {height}x{width} pixels: {reason}") from None
    if tuple(pixels.shape[1:]) != (channels, height, width):
        raise ExportError(f"the image processor made pixel_values of shape {list(pixels.shape[1:])}, "
                          f"not the graph's [{channels}, {height}, {width}]")
    return [pixels[index * batch:(index + 1) * batch].float() for index in range(len(paths) // batch)]
