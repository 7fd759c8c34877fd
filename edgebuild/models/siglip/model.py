"""SigLIP vision encoders as transformers defines them: loading one strictly from a
checkpoint, calibration inputs through its own image processor, forward passes.

Shared by every kind that reads a SigLIP checkpoint (``siglip_f143`` and the
graphs made from it) and by the benchmarks. Its tiny generated checkpoints are
``siglip_fixtures.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.inputs import expand_inputs
from edgebuild.errors import CheckpointError
from edgebuild.models.hf import PREPROCESSOR_FILE, quiet_transformers
from edgebuild.models.hf import image_processor as hf_image_processor

if TYPE_CHECKING:
    import torch

    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.core.kind import InputSet

VISION_PREFIX = "vision_model."
DEFAULT_IMAGE_PROCESSOR = "SiglipImageProcessor"
# One tensor every SigLIP vision encoder has: where it sits says how tensors are named.
PATCH_EMBEDDING = "embeddings.patch_embedding.weight"
VISION_CONFIG_KEY = "vision_config"
SIGLIP_MODEL_TYPE = "siglip"
SIGLIP_VISION_MODEL_TYPE = "siglip_vision_model"


@dataclass(frozen=True)
class SiglipLayout:
    """How a checkpoint stores a SigLIP vision encoder: where ``config.json`` keeps the
    vision settings (``vision_config``, or the top level) and the prefix of the
    encoder's tensor names (``vision_model.``, or none)."""

    name: str
    config_section: str | None
    prefix: str

    def vision_settings(self, config: dict[str, Any]) -> dict[str, Any]:
        """The SiglipVisionConfig arguments of ``config``."""
        return config if self.config_section is None else config[self.config_section]


# Every layout edgebuild reads, by (config section, tensor prefix).
SIGLIP_LAYOUTS = {
    (VISION_CONFIG_KEY, VISION_PREFIX): SiglipLayout(
        "SiglipModel (SiglipConfig; vision_model.* and text_model.* tensors)", VISION_CONFIG_KEY, VISION_PREFIX),
    (VISION_CONFIG_KEY, ""): SiglipLayout(
        "SiglipVisionModel tensors under a SiglipConfig (a built siglip_f143 artifact)", VISION_CONFIG_KEY, ""),
    (None, ""): SiglipLayout(
        "SiglipVisionModel.save_pretrained (SiglipVisionConfig; unprefixed tensors)", None, ""),
    (None, VISION_PREFIX): SiglipLayout(
        "SiglipVisionModel saved by transformers 4 (SiglipVisionConfig; vision_model.* tensors)", None, VISION_PREFIX),
}


def siglip_layout(checkpoint: "Checkpoint") -> SiglipLayout:
    """Which of :data:`SIGLIP_LAYOUTS` ``checkpoint`` is, from its ``config.json`` (a
    SiglipConfig has a ``vision_config``; a SiglipVisionConfig is one, model_type
    ``siglip_vision_model``) and the name of its patch embedding (with the
    ``vision_model.`` prefix or without). Anything else is one error."""
    config = checkpoint.config
    model_type = config.get("model_type")
    if VISION_CONFIG_KEY in config:
        checkpoint.config_section(VISION_CONFIG_KEY)
        if model_type not in (None, SIGLIP_MODEL_TYPE):
            raise CheckpointError(
                f"{checkpoint.config_path}: model_type: expected {SIGLIP_MODEL_TYPE!r} beside a vision_config, "
                f"found {model_type!r}"
            )
        section = VISION_CONFIG_KEY
    elif model_type == SIGLIP_VISION_MODEL_TYPE:
        section = None
    else:
        raise CheckpointError(
            f"{checkpoint.config_path}: not a SigLIP config: expected a 'vision_config' mapping (SiglipConfig) "
            f"or model_type {SIGLIP_VISION_MODEL_TYPE!r} (SiglipVisionConfig), found neither (model_type {model_type!r})"
        )
    tensors = checkpoint.tensors
    prefixed, bare = VISION_PREFIX + PATCH_EMBEDDING in tensors, PATCH_EMBEDDING in tensors
    if prefixed == bare:
        found = "both" if prefixed else f"neither among {len(tensors)} tensors"
        raise CheckpointError(
            f"{checkpoint.label}: not a SigLIP vision encoder: expected a tensor named {VISION_PREFIX}{PATCH_EMBEDDING} "
            f"or {PATCH_EMBEDDING}, found {found} (in {', '.join(path.name for path in checkpoint.shard_files())})"
        )
    return SIGLIP_LAYOUTS[(section, VISION_PREFIX if prefixed else "")]


def vision_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The SiglipVisionConfig arguments of a SigLIP ``config.json`` already read as
    one of the layouts (a built ``siglip_f143`` directory's, say)."""
    section = config.get(VISION_CONFIG_KEY)
    return section if isinstance(section, dict) else config


def vision_config(checkpoint: "Checkpoint", layout: SiglipLayout) -> Any:
    """transformers' ``SiglipVisionConfig`` of the checkpoint; a bad value is a
    one-line error naming config.json."""
    from huggingface_hub.errors import StrictDataclassError
    from transformers import SiglipVisionConfig

    try:
        with quiet_transformers():
            return SiglipVisionConfig(**layout.vision_settings(checkpoint.config))
    except (TypeError, ValueError, StrictDataclassError) as error:
        where = layout.config_section or "(top level)"
        reason = " ".join(str(error).split())
        raise CheckpointError(f"{checkpoint.config_path}: {where}: not a SiglipVisionConfig ({reason})") from None


def image_processor(checkpoint: "Checkpoint") -> Any:
    """The checkpoint's own image processor (``SiglipImageProcessor`` unless its
    ``preprocessor_config.json`` names another)."""
    return hf_image_processor(checkpoint, DEFAULT_IMAGE_PROCESSOR)


def load_pixel_batches(inputs: "InputSet", root: Path, checkpoint: "Checkpoint", what: str) -> list["torch.Tensor"]:
    """One batch per SafeTensors file, plus one batch of all images through the
    checkpoint's own image processor (the seed's layout)."""
    from edgebuild.core.checkpoint import read_header
    from edgebuild.ml.images import load_rgb_image

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


def load_vision_model(
    checkpoint: "Checkpoint", writable: bool = False, replaced: "Callable[[str], bool] | None" = None
) -> tuple[Any, Any]:
    """transformers' ``SiglipVisionModel`` with exactly the checkpoint's encoder tensors,
    in any of :data:`SIGLIP_LAYOUTS`; with its ``SiglipVisionConfig``.

    ``writable=True`` for a model whose weights will be rewritten: they get memory
    of their own instead of a view of the file, but for the parameters ``replaced``
    names (``SiglipVisionModel``'s names), which the caller swaps for new tensors
    instead of writing into (see ``Checkpoint.load``).
    """
    from transformers import SiglipVisionModel
    from transformers.initialization import no_init_weights

    layout = siglip_layout(checkpoint)
    config = vision_config(checkpoint, layout)
    entries = checkpoint.select((layout.prefix,))
    checkpoint.check_float_tensors(entries)
    with no_init_weights():
        model = SiglipVisionModel(config)
    parameters = dict(model.named_parameters())
    # Assign the loaded tensors instead of copying them into the model's: its own
    # (uninitialised, so never touched) are dropped, and the weights are in memory
    # once.
    state = {
        name: tensor.to(parameters[name].dtype) if name in parameters else tensor
        for name, tensor in checkpoint.load(entries, strip_prefix=layout.prefix, owned=writable, replaced=replaced).items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint.label}: the {layout.prefix}* tensors do not match SiglipVisionModel "
            f"(layout: {layout.name}): missing {sorted(missing)[:5]}; unexpected {sorted(unexpected)[:5]}"
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
    from edgebuild.core.hashing import digest_bytes

    return digest_bytes(b"".join(output.detach().float().contiguous().numpy().tobytes() for output in outputs))
