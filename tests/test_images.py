"""Input images: decoded whole as RGB, or one CheckpointError naming the file."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from edgebuild.errors import CheckpointError
from edgebuild.ml.images import MAX_IMAGE_PIXELS, load_rgb_image

# 64 x 64 RGB pixels without long runs, so that half of a compressed file is half an image.
PIXELS = bytes(range(256)) * 48


def _write_image(path: Path, mode: str = "RGB", size: tuple[int, int] = (64, 64)) -> Path:
    from PIL import Image

    Image.frombytes("RGB", (64, 64), PIXELS).resize(size).convert(mode).save(path)
    return path


def _truncate(path: Path) -> Path:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that claims ``width`` x ``height`` pixels: Image.open reads no further."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", b"") + _png_chunk(b"IEND", b"")
    )
    return path


def _error(path: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        load_rgb_image(path)
    return str(caught.value)


def _open_files() -> set[str]:
    links = (f"/proc/self/fd/{fd}" for fd in os.listdir("/proc/self/fd"))
    return {os.readlink(link) for link in links if os.path.exists(link)}


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc/self/fd")
def test_loads_rgb_and_closes_the_file(tmp_path: Path) -> None:
    from PIL import Image

    path = _write_image(tmp_path / "image.png", mode="RGBA")
    image = load_rgb_image(path)
    assert (image.mode, image.size) == ("RGB", (64, 64))
    assert image.tobytes() == Image.frombytes("RGB", (64, 64), PIXELS).tobytes()
    assert str(path) not in _open_files()


def test_truncated_png(tmp_path: Path) -> None:
    path = _truncate(_write_image(tmp_path / "image.png"))
    assert _error(path) == f"{path}: corrupt or truncated image (image file is truncated)"


def test_truncated_jpeg(tmp_path: Path) -> None:
    path = _truncate(_write_image(tmp_path / "image.jpg"))
    assert _error(path) == f"{path}: corrupt or truncated image (image file is truncated (31 bytes not processed))"


def test_truncated_jpeg_when_pillow_is_told_to_load_truncated_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    path = _truncate(_write_image(tmp_path / "image.jpg"))
    assert _error(path) == f"{path}: corrupt or truncated image (image file is truncated (31 bytes not processed))"
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(b"")
    assert _error(path) == f"{path}: empty file, not an image"


def test_not_an_image(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.write_text("a caption, not an image\n")
    assert _error(path) == f"{path}: not an image (no format Pillow reads recognises it)"


def test_over_the_pixel_limit(tmp_path: Path) -> None:
    path = _png_header_only(tmp_path / "bomb.png", 8193, 8192)
    assert _error(path) == (
        f"{path}: refused as a possible decompression bomb: 8193x8192 is 67117056 pixels, "
        f"more than the {MAX_IMAGE_PIXELS} an input image may have"
    )


def test_pillow_decompression_bomb_warning_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    # Pillow warns between its limit and twice that, and raises beyond.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    path = _write_image(tmp_path / "image.png", size=(12, 12))
    assert _error(path) == (
        f"{path}: refused as a possible decompression bomb: Image size (144 pixels) exceeds limit of 100 pixels, "
        "could be decompression bomb DOS attack."
    )


def test_pillow_decompression_bomb_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    path = _write_image(tmp_path / "image.png", size=(30, 30))
    assert _error(path) == (
        f"{path}: refused as a possible decompression bomb: Image size (900 pixels) exceeds limit of 200 pixels, "
        "could be decompression bomb DOS attack."
    )


def test_link_to_a_non_image(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an image\n")
    path = tmp_path / "image.png"
    path.symlink_to("notes.txt")
    assert _error(path) == f"{path} (a link to notes.txt): not an image (no format Pillow reads recognises it)"


def test_link_to_nothing(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.symlink_to("gone.png")
    assert _error(path) == f"{path} (a link to gone.png): file not found"


def test_missing_file(tmp_path: Path) -> None:
    assert _error(tmp_path / "image.png") == f"{tmp_path / 'image.png'}: file not found"


def test_directory(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.mkdir()
    assert _error(path) == f"{path}: is a directory, not an image file"
