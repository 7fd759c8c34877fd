"""Images as the tower takes them: one ``[patches, patch_dim]`` float32 array per image,
by the steps of the checkpoint's ``Qwen2VLImageProcessor``, in NumPy.

The processor is configured by ``preprocessor_config.json`` and nothing else (so the
file is the whole of what the fingerprint must cover). Each image is first resized to
exactly the tower's height x width with the processor's own resampling filter (PIL);
the processor then only rescales, normalises and cuts patches -- its own resize, at a
pixel budget of exactly H x W, would keep the size anyway.

Those three steps are written here rather than called through transformers, whose
image processors import its model code (``processing_utils`` -> ``modeling_utils``,
and through it torchao and torch's compiler): 3 to 5 s at the start of every worker
that quantizes or judges a tower from images, where the steps take milliseconds.
They are the PIL backend's own arithmetic (``Qwen2VLImageProcessorPil``, which the
build called before): a rescale in float64 cast to float32, a normalisation in float32,
the same patch layout; ``tests/test_qwen3_5_tower_images.py`` holds them to the installed
transformers' processor bit for bit, over the settings read here. Calibration
inputs, and so a quantized graph, must not depend on what else a machine has installed:
which backend transformers' own ``Qwen2VLImageProcessor`` resolves to depends on
whether torchvision is installed, and the two need not agree to the last bit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.errors import CheckpointError
from edgebuild.ml.images import load_rgb_image
from edgebuild.models.qwen3_5.geometry import PREPROCESSOR_FILE

if TYPE_CHECKING:
    import numpy
    from PIL import Image

    from edgebuild.core.checkpoint import Checkpoint

# The processor keys that must agree with the tower's vision_config, and the key there.
GEOMETRY_KEYS = {"patch_size": "patch_size", "temporal_patch_size": "temporal_patch_size", "merge_size": "spatial_merge_size"}

# Qwen2VLImageProcessor's defaults, for the keys a preprocessor_config.json may leave out.
DEFAULT_RESAMPLE = 3  # bicubic
DEFAULT_RESCALE_FACTOR = 1 / 255
# OpenAI CLIP's pixel statistics (transformers' OPENAI_CLIP_MEAN and OPENAI_CLIP_STD).
DEFAULT_IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
DEFAULT_IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
# PIL's filters by number: nearest, lanczos, bilinear, bicubic, box, hamming.
RESAMPLE_FILTERS = range(6)
CHANNELS = 3


def read_preprocessor_config(checkpoint: "Checkpoint") -> dict[str, Any]:
    """``preprocessor_config.json``, checked against the tower's ``vision_config``."""
    path = checkpoint.directory / PREPROCESSOR_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{path}: missing; expected the checkpoint's Qwen2VLImageProcessor configuration "
            f"(calibration and held-out images are turned into the tower's patches by it)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not a JSON object ({error})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(config).__name__}")
    vision = checkpoint.config_section("vision_config")
    for key, vision_key in GEOMETRY_KEYS.items():
        expected = vision.get(vision_key)
        if config.get(key) != expected:
            raise CheckpointError(
                f"{path}: {key}: expected {expected} (vision_config.{vision_key} of {checkpoint.config_path.name}), "
                f"found {config.get(key)!r}"
            )
    PatchPreprocessing.from_config(config, path)
    return config


@dataclass(frozen=True)
class PatchPreprocessing:
    """What ``Qwen2VLImageProcessor`` does to an image already at the tower's size.
    ``rescale_factor`` is None where ``do_rescale`` is false, ``mean`` and ``std`` where
    ``do_normalize`` is."""

    resample: int
    rescale_factor: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None
    patch_size: int
    temporal_patch_size: int
    merge_size: int

    @classmethod
    def from_config(cls, config: dict[str, Any], path: Path) -> "PatchPreprocessing":
        def flag(key: str) -> bool:
            value = config.get(key, True)
            if not isinstance(value, bool):
                raise CheckpointError(f"{path}: {key}: expected true or false, found {value!r}")
            return value

        def number(value: Any, key: str, positive: bool) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
                    positive and value <= 0):
                raise CheckpointError(f"{path}: {key}: expected a {'positive ' if positive else ''}number, "
                                      f"found {value!r}")
            return value

        def per_channel(key: str, default: tuple[float, ...], positive: bool) -> tuple[float, ...]:
            value = config.get(key, default)
            # A single number applies to every channel, as the processor takes it.
            values = value if isinstance(value, (list, tuple)) else [value] * CHANNELS
            if len(values) != CHANNELS:
                raise CheckpointError(f"{path}: {key}: expected {CHANNELS} numbers (one per RGB channel), "
                                      f"found {len(values)}")
            return tuple(number(item, key, positive) for item in values)

        resample = config.get("resample", DEFAULT_RESAMPLE)
        if isinstance(resample, bool) or resample not in RESAMPLE_FILTERS:
            raise CheckpointError(f"{path}: resample: expected a PIL filter number 0 to 5, found {resample!r}")
        rescale = number(config.get("rescale_factor", DEFAULT_RESCALE_FACTOR), "rescale_factor", True) \
            if flag("do_rescale") else None
        normalize = flag("do_normalize")
        return cls(
            resample=resample,
            rescale_factor=rescale,
            mean=per_channel("image_mean", DEFAULT_IMAGE_MEAN, False) if normalize else None,
            std=per_channel("image_std", DEFAULT_IMAGE_STD, True) if normalize else None,
            patch_size=config["patch_size"],
            temporal_patch_size=config["temporal_patch_size"],
            merge_size=config["merge_size"],
        )

    def patches(self, image: "Image.Image") -> "numpy.ndarray":
        """One RGB image at the tower's size as ``[patches, patch_dim]`` float32."""
        import numpy

        pixels = numpy.moveaxis(numpy.asarray(image), -1, 0)  # channels first
        if self.rescale_factor is not None:
            # Upcast first, as transformers does: uint8 * a Python float is float64 anyway.
            pixels = (pixels.astype(numpy.float64) * self.rescale_factor).astype(numpy.float32)
        if self.mean is not None and self.std is not None:
            if not numpy.issubdtype(pixels.dtype, numpy.floating):
                pixels = pixels.astype(numpy.float32)
            mean = numpy.array(self.mean, dtype=pixels.dtype)[:, None, None]
            std = numpy.array(self.std, dtype=pixels.dtype)[:, None, None]
            pixels = (pixels - mean) / std
        pixels = numpy.asarray(pixels, dtype=numpy.float32)
        channels, height, width = pixels.shape
        patch, merge, temporal = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = height // patch, width // patch
        # Qwen2-VL's layout: rows in merge x merge blocks, left to right, top to bottom;
        # each row (channel, temporal copy, patch_y, patch_x) of one still image.
        blocks = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        blocks = numpy.transpose(blocks, (1, 4, 2, 5, 0, 3, 6))
        blocks = numpy.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], temporal, patch, patch))
        return blocks.reshape(grid_h * grid_w, channels * temporal * patch * patch)


def patch_preprocessing(checkpoint: "Checkpoint") -> PatchPreprocessing:
    """The checkpoint's image preprocessing, from its ``preprocessor_config.json``."""
    return PatchPreprocessing.from_config(read_preprocessor_config(checkpoint), checkpoint.directory / PREPROCESSOR_FILE)


def image_patches(preprocessing: PatchPreprocessing, item: "Path | Image.Image", geometry: dict[str, Any]) -> "numpy.ndarray":
    """One image (a path, or an RGB image read) as ``[patches, patch_dim]`` float32, at
    the tower's size."""
    height, width = geometry["height"], geometry["width"]
    image = load_rgb_image(item) if isinstance(item, Path) else item
    if image.size != (width, height):
        image = image.resize((width, height), resample=preprocessing.resample)
    return preprocessing.patches(image)


def images_to_patches(preprocessing: PatchPreprocessing, images: "list[Path | Image.Image]",
                      geometry: dict[str, Any]) -> list["numpy.ndarray"]:
    """:func:`image_patches` of each of ``images``, in order."""
    return [image_patches(preprocessing, item, geometry) for item in images]
