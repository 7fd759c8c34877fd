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


def load_pixel_batches(inputs: "InputSet", root: Path, checkpoint: "Checkpoint", what: str) -> list["torch.Tensor"]:
    """One batch per SafeTensors file, plus one batch of all images through the
    checkpoint's own image processor (the seed's layout)."""
    from safetensors import safe_open

    batches = []
    for path in expand_inputs(inputs.pixel_values, root, f"{what}.pixel_values"):
        with safe_open(str(path), framework="pt", device="cpu") as source:
            if "pixel_values" not in source.keys():
                raise CheckpointError(f"{path}: no 'pixel_values' tensor (found {', '.join(source.keys()) or 'none'})")
            batches.append(source.get_tensor("pixel_values").float())
    images = expand_inputs(inputs.images, root, f"{what}.images")
    if images:
        from PIL import Image
        from transformers import AutoImageProcessor

        with quiet_transformers():
            processor = AutoImageProcessor.from_pretrained(str(checkpoint.directory), local_files_only=True)
        loaded = []
        for path in images:
            with Image.open(path) as image:
                loaded.append(image.convert("RGB"))
        batches.append(processor(images=loaded, return_tensors="pt")["pixel_values"].float())
    return batches


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
