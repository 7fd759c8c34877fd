"""Small deterministic images to calibrate and check encoders with, when a project
has none of its own: ``python -m edgebuild init`` writes them, and the repository's
``data/`` holds the same files (``scripts/make_calibration_images.py``).

Synthetic scenes (gradients, discs, stripes, noise) rather than photographs: no
licence questions, a few KB each, and varied enough that the activations of a
vision encoder are not degenerate. The same seed gives the same bytes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from PIL import Image

# Folder -> the seeds of its scenes. Calibration and held-out never share a seed.
SAMPLE_SETS = {"calibration": range(4), "held_out": range(100, 102)}


def scene(seed: int, size: int = 96) -> "Image.Image":
    import numpy
    from PIL import Image

    rng = numpy.random.default_rng(seed)
    y, x = numpy.mgrid[0:size, 0:size] / size
    angle = rng.uniform(0, numpy.pi)
    base = numpy.cos(angle) * x + numpy.sin(angle) * y
    image = numpy.stack([base * rng.uniform(0.3, 1.0) + rng.uniform(0, 0.4) for _ in range(3)], axis=-1)
    for _ in range(rng.integers(2, 6)):
        cx, cy, radius = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        disc = (x - cx) ** 2 + (y - cy) ** 2 < radius**2
        image[disc] = rng.uniform(0, 1, 3)
    stripes = (numpy.sin(x * rng.uniform(10, 60)) > 0.7)[..., None]
    image = numpy.where(stripes, image * 0.6, image)
    image += rng.normal(0, 0.03, image.shape)
    return Image.fromarray((numpy.clip(image, 0, 1) * 255).astype(numpy.uint8))


def sample_image_files() -> dict[str, int]:
    """Relative path (``calibration/scene_000.png``) -> the seed of its scene."""
    return {f"{folder}/scene_{seed:03d}.png": seed for folder, seeds in SAMPLE_SETS.items() for seed in seeds}


def encode_png(seed: int) -> bytes:
    import io

    buffer = io.BytesIO()
    scene(seed).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def write_sample_images(directory: Path) -> list[Path]:
    """Write every sample image under ``directory`` (overwriting); return the paths."""
    written = []
    for relative, seed in sample_image_files().items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_png(seed))
        written.append(path)
    return written


def starter_samples(folder: str = "data") -> dict[str, Callable[[], bytes]]:
    """The sample images as a starter entry's ``samples``: path under the project
    (``data/calibration/scene_000.png``) -> a function that encodes it."""
    return {f"{folder}/{relative}": functools.partial(encode_png, seed) for relative, seed in sample_image_files().items()}
