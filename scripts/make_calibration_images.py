"""Write the small deterministic calibration images shipped in data/.

    .venv/bin/python scripts/make_calibration_images.py

Synthetic scenes (gradients, discs, stripes, noise) rather than photographs:
no licence questions, a few KB each, and varied enough that the activations
of a vision encoder are not degenerate. Re-running reproduces the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent / "data"


def scene(seed: int, size: int = 96) -> Image.Image:
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


def main() -> None:
    for folder, seeds in (("calibration", range(4)), ("held_out", range(100, 102))):
        (ROOT / folder).mkdir(parents=True, exist_ok=True)
        for seed in seeds:
            scene(seed).save(ROOT / folder / f"scene_{seed:03d}.png", optimize=True)


if __name__ == "__main__":
    main()
