"""``python -m edgebuild check``: the manifest alone, or (``--deep``) every artifact
against its checkpoints and input files, as its build would check them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import TOWER_MANIFEST

MANIFEST = TOWER_MANIFEST.replace("image_size: 64", "image_size: 100") + (
    "  q:\n    kind: siglip_f143\n    checkpoint: qwen\n    calibration:\n      images: [missing/*.png]\n"
    "  fine:\n    kind: qwen3_5_vision_tower\n    description: at 96\n    checkpoint: qwen\n    image_size: 96\n"
)


def check(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgebuild", "check", *args], cwd=cwd, capture_output=True, text=True)


@pytest.mark.slow
def test_check_deep_finds_what_the_build_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(MANIFEST)
    listing = "t\tqwen3_5_vision_tower\t\nq\tsiglip_f143\t\nfine\tqwen3_5_vision_tower\tat 96\n"
    shallow = check(cwd=tmp_path)
    assert (shallow.returncode, shallow.stdout, shallow.stderr) == (0, listing, "")

    deep = check("--deep", cwd=tmp_path)
    assert deep.returncode == 2
    assert deep.stdout == listing
    fixture = next((tmp_path / "cache" / "fixtures").iterdir())
    assert deep.stderr == (
        "edgebuild: error: artifacts.yaml:8:5: artifacts -> t -> image_size: height 100 is not a multiple of "
        "patch_size x spatial_merge_size = 16 x 2 = 32; nearest valid sizes: 96, 128 "
        f"(vision_config of checkpoint 'qwen' ({fixture}))\n"
        f"edgebuild: error: artifacts.yaml:11:5: artifacts -> q -> checkpoint: {fixture / 'config.json'}: "
        "model_type: expected 'siglip' beside a vision_config, found 'qwen3_5'\n"
    )
    assert "Traceback" not in deep.stderr


@pytest.mark.slow
def test_check_deep_names_a_missing_input(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(
        "checkpoints:\n  siglip:\n    fixture: siglip_tiny\nartifacts:\n"
        "  q:\n    kind: siglip_f143\n    checkpoint: siglip\n    calibration:\n      images: [missing/*.png]\n"
    )
    deep = check("--deep", "artifacts.yaml", cwd=tmp_path)
    assert deep.returncode == 2
    assert deep.stderr == (
        f"edgebuild: error: artifacts.yaml:9:7: artifacts -> q -> calibration -> images: 'missing/*.png' matches no file (relative to {tmp_path})\n"
    )


@pytest.mark.slow
def test_a_matched_input_that_is_not_a_readable_file_is_named(tmp_path: Path) -> None:
    """A glob match replaced by a dangling symlink (or a FIFO) is an error naming it: the
    build must not calibrate on three of four images. A directory a wildcard matches is
    passed over."""
    import os
    import shutil

    from helpers import REPO

    images = tmp_path / "imgs"
    images.mkdir()
    for source in sorted((REPO / "data" / "calibration").glob("*.png"))[:3]:
        shutil.copy(source, images / source.name)
    (images / "nested").mkdir()
    (tmp_path / "artifacts.yaml").write_text(
        "checkpoints:\n  siglip:\n    fixture: siglip_tiny\nartifacts:\n"
        "  q:\n    kind: siglip_f143\n    checkpoint: siglip\n    calibration:\n      images: [imgs/*]\n"
    )
    assert check("--deep", cwd=tmp_path).returncode == 0
    os.symlink(tmp_path / "gone.png", images / "d.png")
    dangling = check("--deep", cwd=tmp_path)
    assert dangling.returncode == 2
    assert dangling.stderr == (
        f"edgebuild: error: artifacts.yaml:9:7: artifacts -> q -> calibration -> images: 'imgs/*' matches "
        f"{images / 'd.png'}, a symlink to nothing; expected a readable file\n"
    )
    (images / "d.png").unlink()
    os.mkfifo(images / "e.png")
    fifo = check("--deep", cwd=tmp_path)
    assert fifo.returncode == 2 and f"matches {images / 'e.png'}, not a regular file; expected a readable file" in fifo.stderr


@pytest.mark.parametrize("args, line", [
    (("init", "--ci", "gitlab"), "python -m edgebuild init: argument --ci: invalid choice: 'gitlab' (choose from "
                                 "'github', 'script'); `python -m edgebuild init --help` shows the usage"),
    (("check", "--deeper"), "python -m edgebuild: unrecognized arguments: --deeper; `python -m edgebuild --help` "
                            "shows the usage"),
    (("fetch", "t"), "python -m edgebuild fetch: the following arguments are required: --from, --to; "
                     "`python -m edgebuild fetch --help` shows the usage"),
    ((), "python -m edgebuild: the following arguments are required: command; `python -m edgebuild --help` shows "
         "the usage"),
])
def test_a_misused_option_of_python_m_edgebuild_is_one_line(tmp_path: Path, args: tuple[str, ...], line: str) -> None:
    result = subprocess.run([sys.executable, "-m", "edgebuild", *args], cwd=tmp_path, capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"edgebuild: error: {line}\n")
