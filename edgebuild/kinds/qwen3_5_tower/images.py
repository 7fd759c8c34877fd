"""Images as the tower takes them: one ``[patches, patch_dim]`` float32 array per image,
through the checkpoint's own ``Qwen2VLImageProcessor``.

The processor is configured by ``preprocessor_config.json`` and nothing else (so the
file is the whole of what the fingerprint must cover). Each image is first resized to
exactly the tower's height x width with the processor's own resampling filter; the
processor then only rescales, normalises and cuts patches (its own resize, at a pixel
budget of exactly H x W, would keep the size anyway). The PIL implementation is chosen
explicitly: which backend ``Qwen2VLImageProcessor`` resolves to depends on whether
torchvision is installed, and the two need not agree to the last bit -- calibration
inputs, and so a quantized graph, must not depend on what else a machine has installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.plugin import CheckpointError
from edgebuild.ml.images import load_rgb_image

if TYPE_CHECKING:
    import numpy
    from PIL import Image

    from edgebuild.core.checkpoint import Checkpoint

PREPROCESSOR_FILE = "preprocessor_config.json"

# The processor keys that must agree with the tower's vision_config, and the key there.
GEOMETRY_KEYS = {"patch_size": "patch_size", "temporal_patch_size": "temporal_patch_size", "merge_size": "spatial_merge_size"}


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
    return config


def image_processor(checkpoint: "Checkpoint") -> Any:
    from transformers import Qwen2VLImageProcessorPil
    from transformers.utils import logging

    config = read_preprocessor_config(checkpoint)
    # The file names the processor type it was saved from (often the torchvision one);
    # transformers remarks on the difference, which is the point of choosing PIL here.
    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        return Qwen2VLImageProcessorPil.from_dict(config)
    finally:
        logging.set_verbosity(previous)


def images_to_patches(processor: Any, images: "list[Path | Image.Image]", geometry: dict[str, Any]) -> list["numpy.ndarray"]:
    """One ``[patches, patch_dim]`` array per image (a path, or an RGB image read), through
    ``processor`` at the tower's size."""
    import numpy

    height, width = geometry["height"], geometry["width"]
    resized = []
    for item in images:
        image = load_rgb_image(item) if isinstance(item, Path) else item
        resized.append(image if image.size == (width, height) else image.resize((width, height), resample=processor.resample))
    batch = processor(images=resized, do_resize=False, return_tensors="np")
    pixels, grids = numpy.asarray(batch["pixel_values"], dtype=numpy.float32), numpy.asarray(batch["image_grid_thw"])
    expected = [1, geometry["grid_h"], geometry["grid_w"]]
    # The processor concatenates a batch's patches; its grid says where each image ends.
    samples, offset = [], 0
    for item, grid in zip(images, grids):
        if grid.tolist() != expected:
            raise CheckpointError(f"{item if isinstance(item, Path) else 'an image'}: the image processor made a "
                                  f"{grid.tolist()} grid of it; expected {expected}")
        count = int(numpy.prod(grid))
        samples.append(numpy.ascontiguousarray(pixels[offset:offset + count]))
        offset += count
    return samples
