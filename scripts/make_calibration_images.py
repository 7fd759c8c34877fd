"""Write the small deterministic calibration and held-out images shipped in data/.

    .venv/bin/python scripts/make_calibration_images.py

The images come from ``edgebuild.models.sample_images`` (``python -m edgebuild init``
writes the same files into a new project); re-running reproduces the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from edgebuild.models.sample_images import write_sample_images

ROOT = Path(__file__).resolve().parent.parent / "data"


def main() -> None:
    write_sample_images(ROOT)


if __name__ == "__main__":
    main()
