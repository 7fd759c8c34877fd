"""SigLIP vision encoders as transformers defines them: loading one strictly from a
checkpoint, calibration inputs through its own image processor, forward passes.

Shared by every kind that reads a SigLIP checkpoint (``siglip_f143`` and the
graphs made from it) and by the benchmarks.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from .errors import CheckpointError
from .inputs import expand_inputs

if TYPE_CHECKING:
    import torch

    from .checkpoint import Checkpoint
    from .kinds.base import InputSet

VISION_PREFIX = "vision_model."
PREPROCESSOR_FILE = "preprocessor_config.json"
DEFAULT_IMAGE_PROCESSOR = "SiglipImageProcessor"


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' advisory warnings for one call: that the fast image
    processor wants torchvision (the PIL one it falls back to is transformers' own),
    and SiglipConfig's remarks about the text tower's token ids (never used here)."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)


def image_processor(checkpoint: "Checkpoint") -> Any:
    """The checkpoint's own image processor, from its ``preprocessor_config.json`` alone
    (read through ``Checkpoint.file``, so the fingerprint covers it). transformers'
    ``AutoImageProcessor`` would also consult ``config.json`` and the hub cache."""
    import json

    import transformers

    path = checkpoint.file(PREPROCESSOR_FILE)
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not a JSON object ({error})") from None
    if not isinstance(settings, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(settings).__name__}")
    # The "Fast" processors need torchvision; their slow twins compute the same values.
    name = str(settings.get("image_processor_type", DEFAULT_IMAGE_PROCESSOR)).removesuffix("Fast")
    processor_class = getattr(transformers, name, None)
    if processor_class is None or not name.endswith("ImageProcessor"):
        raise CheckpointError(f"{path}: image_processor_type: {name!r} is not an image processor transformers provides")
    try:
        with quiet_transformers():
            return processor_class.from_dict(settings)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{path}: not a valid {name} configuration ({error})") from None


def load_pixel_batches(inputs: "InputSet", root: Path, checkpoint: "Checkpoint", what: str) -> list["torch.Tensor"]:
    """One batch per SafeTensors file, plus one batch of all images through the
    checkpoint's own image processor (the seed's layout)."""
    from .checkpoint import read_header
    from .images import load_rgb_image

    batches = []
    for path in expand_inputs(inputs.pixel_values, root, f"{what}.pixel_values"):
        header, _ = read_header(path)
        if "pixel_values" not in header:
            found = ", ".join(name for name in header if name != "__metadata__") or "none"
            raise CheckpointError(f"{path}: no 'pixel_values' tensor (found {found})")
        batches.append(_read_pixel_values(path))
    images = expand_inputs(inputs.images, root, f"{what}.images")
    if images:
        processor = image_processor(checkpoint)
        loaded = [load_rgb_image(path) for path in images]
        with quiet_transformers():
            batches.append(processor(images=loaded, return_tensors="pt")["pixel_values"].float())
    return batches


def _read_pixel_values(path: Path) -> "torch.Tensor":
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as source:
        pixels = source.get_tensor("pixel_values")
    if pixels.ndim != 4 or pixels.shape[1] != 3 or not pixels.is_floating_point():
        raise CheckpointError(
            f"{path}: pixel_values: expected a float tensor [images, 3, height, width], "
            f"found {str(pixels.dtype).removeprefix('torch.')} {list(pixels.shape)}"
        )
    return pixels.float()


def load_vision_model(checkpoint: "Checkpoint", writable: bool = False) -> tuple[Any, Any]:
    """transformers' ``SiglipVisionModel`` with exactly the checkpoint's ``vision_model.*`` tensors.

    ``writable=True`` for a model whose weights will be rewritten: they get memory
    of their own instead of a view of the file (see ``Checkpoint.load``).
    """
    from transformers import SiglipConfig, SiglipVisionModel
    from transformers.initialization import no_init_weights

    try:
        with quiet_transformers():
            config = SiglipConfig(**checkpoint.config)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{checkpoint.config_path}: not a SiglipConfig ({error})") from None
    entries = checkpoint.select((VISION_PREFIX,))
    checkpoint.check_float_tensors(entries)
    with no_init_weights():
        model = SiglipVisionModel(config.vision_config)
    parameters = dict(model.named_parameters())
    # Assign the loaded tensors instead of copying them into the model's: its own
    # (uninitialised, so never touched) are dropped, and the weights are in memory
    # once.
    state = {
        name: tensor.to(parameters[name].dtype) if name in parameters else tensor
        for name, tensor in checkpoint.load(entries, strip_prefix=VISION_PREFIX, owned=writable).items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint.label}: the vision_model.* tensors do not match SiglipVisionModel: "
            f"missing {sorted(missing)[:5]}; unexpected {sorted(unexpected)[:5]}"
        )
    return model.eval(), config


def encoder_outputs(model: Any, batches: list["torch.Tensor"], device: Any = "cpu") -> list["torch.Tensor"]:
    """``last_hidden_state`` of each batch, at the checkpoint's own image size."""
    import torch

    with torch.inference_mode():
        return [
            model(pixel_values=pixels.to(device), interpolate_pos_encoding=False).last_hidden_state.clone()
            for pixels in batches
        ]


def outputs_digest(outputs: list["torch.Tensor"]) -> str:
    """One digest of a list of outputs' float32 bytes: "the same outputs" without keeping them."""
    from .hashing import digest_bytes

    return digest_bytes(b"".join(output.detach().float().contiguous().numpy().tobytes() for output in outputs))
