"""The tower's inputs from images and SafeTensors files: one ``[patches, patch_dim]``
float32 array per image, exactly what the exported tower's ``patches`` input takes.

Images go through the checkpoint's own ``Qwen2VLImageProcessor``, configured by its
``preprocessor_config.json`` and nothing else (so the file is the whole of what the
fingerprint must cover). Each image is first resized to exactly the tower's height x
width with the processor's own resampling filter; the processor then only rescales,
normalises and cuts patches (its own resize, at a pixel budget of exactly H x W,
would keep the size anyway). The PIL implementation is chosen explicitly: which
backend ``Qwen2VLImageProcessor`` resolves to depends on whether torchvision is
installed, and the two need not agree to the last bit -- calibration inputs, and so
the quantized graph, must not depend on what else a machine has installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.plugin import CheckpointError, expand_inputs
from edgebuild.ml.images import load_rgb_image
from .params import PATCHES_INPUT, PREPROCESSOR_FILE, TowerInputs

if TYPE_CHECKING:
    import numpy

    from edgebuild.core.checkpoint import Checkpoint

# The processor keys that must agree with the tower's vision_config, and the key there.
GEOMETRY_KEYS = {"patch_size": "patch_size", "temporal_patch_size": "temporal_patch_size", "merge_size": "spatial_merge_size"}
# Images per processor call: bounded memory for any number of calibration images.
IMAGES_PER_BATCH = 8


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


def tower_inputs(inputs: TowerInputs, root: Path, checkpoint: "Checkpoint", geometry: dict[str, Any], what: str) -> list["numpy.ndarray"]:
    """Every input as ``[patches, patch_dim]`` float32: patches files first, then images,
    each in the order its pattern lists them."""
    samples = []
    for path in expand_inputs(inputs.patches, root, f"{what}.patches"):
        samples.extend(_patches_file(path, geometry))
    images = expand_inputs(inputs.images, root, f"{what}.images")
    if images:
        processor = image_processor(checkpoint)
        for start in range(0, len(images), IMAGES_PER_BATCH):
            samples.extend(images_to_patches(processor, images[start:start + IMAGES_PER_BATCH], geometry))
    return samples


def images_to_patches(processor: Any, paths: list[Path], geometry: dict[str, Any]) -> list["numpy.ndarray"]:
    """One ``[patches, patch_dim]`` array per image, through ``processor`` at the tower's size."""
    import numpy

    height, width = geometry["height"], geometry["width"]
    resized = []
    for path in paths:
        image = load_rgb_image(path)
        resized.append(image if image.size == (width, height) else image.resize((width, height), resample=processor.resample))
    batch = processor(images=resized, do_resize=False, return_tensors="np")
    pixels, grids = numpy.asarray(batch["pixel_values"], dtype=numpy.float32), numpy.asarray(batch["image_grid_thw"])
    expected = [1, geometry["grid_h"], geometry["grid_w"]]
    # The processor concatenates a batch's patches; its grid says where each image ends.
    samples, offset = [], 0
    for path, grid in zip(paths, grids):
        if grid.tolist() != expected:
            raise CheckpointError(f"{path}: the image processor made a {grid.tolist()} grid of it; expected {expected}")
        count = int(numpy.prod(grid))
        samples.append(numpy.ascontiguousarray(pixels[offset:offset + count]))
        offset += count
    return samples


def _patches_file(path: Path, geometry: dict[str, Any]) -> list["numpy.ndarray"]:
    import numpy
    from safetensors import safe_open

    patches, patch_dim = geometry["patches"], geometry["patch_dim"]
    expected = f"[n * {patches}, {patch_dim}] or [n, {patches}, {patch_dim}]"
    try:
        with safe_open(str(path), framework="np") as source:
            if PATCHES_INPUT not in source.keys():
                raise CheckpointError(f"{path}: no '{PATCHES_INPUT}' tensor (found {', '.join(source.keys()) or 'none'})")
            tensor = source.get_tensor(PATCHES_INPUT)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a SafeTensors file ({error})") from None
    shape = list(tensor.shape)
    if tensor.ndim == 3 and shape[1:] == [patches, patch_dim]:
        images = tensor
    elif tensor.ndim == 2 and shape[1] == patch_dim and shape[0] % patches == 0 and shape[0]:
        images = tensor.reshape(-1, patches, patch_dim)
    else:
        raise CheckpointError(f"{path}: tensor '{PATCHES_INPUT}': expected shape {expected} for this tower, found {shape}")
    if not numpy.issubdtype(images.dtype, numpy.floating):
        raise CheckpointError(f"{path}: tensor '{PATCHES_INPUT}': expected a float dtype, found {images.dtype}")
    return [numpy.ascontiguousarray(image, dtype=numpy.float32) for image in images]
