"""A Qwen3.5 tower's image preprocessing (``kinds/qwen3_5_tower/images.py``), held to the
installed transformers' ``Qwen2VLImageProcessorPil`` bit for bit: edgebuild runs the
processor's steps in NumPy so that a worker quantizing or judging a tower from images
does not import transformers' model code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy
import pytest
from PIL import Image

from edgebuild.errors import CheckpointError
from edgebuild.models.qwen3_5.images import PatchPreprocessing, images_to_patches

from helpers import REPO

# The fixture's settings, as the real Qwen3.5 checkpoints ship them.
QWEN3_5 = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "temporal_patch_size": 2,
           "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
           "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
# Qwen2-VL's: patch 14, and the processor's own defaults for what it leaves out (CLIP's
# mean and std, 1/255, bicubic).
QWEN2_VL = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}

SETTINGS = {
    "qwen3_5": QWEN3_5,
    "defaults": QWEN2_VL,
    "no_rescale": QWEN3_5 | {"do_rescale": False},
    "no_normalize": QWEN3_5 | {"do_normalize": False},
    "neither": QWEN3_5 | {"do_rescale": False, "do_normalize": False},
    "one_number": QWEN2_VL | {"image_mean": 0.25, "image_std": 0.75, "rescale_factor": 0.0039},
    "integers": QWEN3_5 | {"image_mean": [0, 1, 2], "image_std": [1, 2, 3], "rescale_factor": 1},
    "nearest": QWEN3_5 | {"resample": 0},
    "temporal_1": QWEN3_5 | {"temporal_patch_size": 1, "merge_size": 1},
}


def geometry(settings: dict, height: int, width: int) -> dict:
    patch = settings["patch_size"]
    return {"height": height, "width": width, "grid_h": height // patch, "grid_w": width // patch}


def transformers_patches(settings: dict, images: list[Image.Image], height: int, width: int) -> list[numpy.ndarray]:
    """What the build called before: the PIL processor, its resize skipped (the image is
    at the tower's size already), its concatenated rows cut at each image's grid."""
    from transformers import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_dict(settings)
    resized = [image if image.size == (width, height) else image.resize((width, height), resample=processor.resample)
               for image in images]
    batch = processor(images=resized, do_resize=False, return_tensors="np")
    counts = [int(numpy.prod(grid)) for grid in batch["image_grid_thw"]]
    return numpy.split(batch["pixel_values"], numpy.cumsum(counts)[:-1])


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_patches_are_the_transformers_processor_s_bit_for_bit(name: str, tmp_path: Path) -> None:
    settings = SETTINGS[name]
    size = settings["patch_size"] * settings["merge_size"]
    height, width = 2 * size, 4 * size
    random = numpy.random.default_rng(len(name))
    images = [Image.fromarray(random.integers(0, 256, (height, width, 3), dtype=numpy.uint8)),
              # Another size, resized first with the processor's filter.
              Image.fromarray(random.integers(0, 256, (37, 91, 3), dtype=numpy.uint8)),
              # Saturated pixels: the ends of the range after rescaling and normalising.
              Image.fromarray(numpy.tile(numpy.array([0, 255, 128], dtype=numpy.uint8), (height, width, 1)))]
    images += [Image.open(path).convert("RGB") for path in sorted((REPO / "data" / "calibration").glob("*.png"))[:2]]
    ours = images_to_patches(PatchPreprocessing.from_config(settings, tmp_path / "preprocessor_config.json"), images,
                             geometry(settings, height, width))
    theirs = transformers_patches(settings, images, height, width)
    assert len(ours) == len(theirs) == len(images)
    for index, (mine, reference) in enumerate(zip(ours, theirs)):
        assert mine.dtype == reference.dtype == numpy.float32, index
        assert mine.shape == reference.shape, index
        assert numpy.array_equal(mine, reference), (index, float(numpy.abs(mine - reference).max()))


def test_the_shipped_images_give_the_processor_s_patches_at_the_fixture_s_sizes(tmp_path: Path) -> None:
    paths = sorted((REPO / "data" / "calibration").glob("*.png")) + sorted((REPO / "data" / "held_out").glob("*.png"))
    images = [Image.open(path).convert("RGB") for path in paths]
    preprocessing = PatchPreprocessing.from_config(QWEN3_5, tmp_path / "preprocessor_config.json")
    for height, width in [(224, 224), (448, 448), (64, 128)]:
        ours = images_to_patches(preprocessing, paths, geometry(QWEN3_5, height, width))
        theirs = transformers_patches(QWEN3_5, images, height, width)
        assert all(numpy.array_equal(mine, reference) for mine, reference in zip(ours, theirs, strict=True))


@pytest.mark.parametrize("change, message", [
    ({"do_rescale": "yes"}, "do_rescale: expected true or false, found 'yes'"),
    ({"rescale_factor": 0}, "rescale_factor: expected a positive number, found 0"),
    ({"rescale_factor": "1/255"}, "rescale_factor: expected a positive number, found '1/255'"),
    ({"image_mean": [0.5, 0.5]}, "image_mean: expected 3 numbers (one per RGB channel), found 2"),
    ({"image_mean": [0.5, None, 0.5]}, "image_mean: expected a number, found None"),
    ({"image_std": [0.5, 0.0, 0.5]}, "image_std: expected a positive number, found 0.0"),
    ({"image_std": True}, "image_std: expected a positive number, found True"),
    ({"resample": 7}, "resample: expected a PIL filter number 0 to 5, found 7"),
    ({"resample": "bicubic"}, "resample: expected a PIL filter number 0 to 5, found 'bicubic'"),
])
def test_settings_it_cannot_apply_are_refused_in_one_line(change: dict, message: str, tmp_path: Path) -> None:
    path = tmp_path / "preprocessor_config.json"
    with pytest.raises(CheckpointError) as caught:
        PatchPreprocessing.from_config(QWEN3_5 | change, path)
    assert str(caught.value) == f"{path}: {message}"


def test_settings_that_normalising_off_makes_moot_are_not_read(tmp_path: Path) -> None:
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps(QWEN3_5))
    preprocessing = PatchPreprocessing.from_config(QWEN3_5 | {"do_normalize": False, "image_std": [0, 0, 0]}, path)
    assert preprocessing.mean is None and preprocessing.std is None
