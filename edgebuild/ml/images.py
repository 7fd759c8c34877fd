"""Reading an input image (calibration, verification) as RGB pixels.

Any file that is not a whole, readable image of sensible size is one
``CheckpointError`` naming the file, never an exception out of Pillow.
"""

from __future__ import annotations

import os
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from edgebuild.errors import CheckpointError

if TYPE_CHECKING:
    from PIL import Image

# Input images are resized to the model's input, a few hundred pixels a side, so a
# larger one buys nothing. 8192 x 8192 admits any camera photo up to 67 megapixels
# and caps the decoded RGB image at 192 MiB; it is below Pillow's own warning
# threshold (89.5 megapixels), so this limit is the one that applies.
MAX_IMAGE_PIXELS = 8192 * 8192

# What Pillow raises for a corrupt file depends on the format and on the step that
# fails: each of these has come out of Image.open, load or convert on damaged PNG,
# JPEG, GIF, BMP, TIFF, WebP, ICO, PPM and TGA files.
MALFORMED_IMAGE_ERRORS = (OSError, SyntaxError, ValueError, TypeError, EOFError, struct.error)


def _described(path: Path) -> str:
    """The path, and where it points when it is a symbolic link: a link to the wrong
    file is the usual cause when a link is not an image."""
    if path.is_symlink():
        return f"{path} (a link to {os.readlink(path)})"
    return str(path)


@contextmanager
def _truncated_images_refused() -> Iterator[None]:
    """Pillow fills in the missing part of a truncated image with grey when the
    process-wide ``ImageFile.LOAD_TRUNCATED_IMAGES`` is set, and other libraries set
    it. An input image must be whole, so the flag is off while one loads."""
    from PIL import ImageFile

    previous = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous


def load_rgb_image(path: Path) -> Image.Image:
    """The image at ``path``, decoded in full and converted to RGB; the file is closed."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    name = _described(path)
    if path.is_dir():
        raise CheckpointError(f"{name}: is a directory, not an image file")
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"{name}: file not found") from None
    except OSError as error:
        raise CheckpointError(f"{name}: cannot read ({error.strerror})") from None
    # Opened here rather than by Image.open, which leaves its own file open when
    # it raises a decompression bomb error.
    with handle, warnings.catch_warnings():
        if os.fstat(handle.fileno()).st_size == 0:
            raise CheckpointError(f"{name}: empty file, not an image")
        # Pillow only warns between its limit and twice that; an image that large is
        # refused like one over twice the limit.
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(handle) as image:
                width, height = image.size
                if width * height > MAX_IMAGE_PIXELS:
                    raise CheckpointError(
                        f"{name}: refused as a possible decompression bomb: {width}x{height} is "
                        f"{width * height} pixels, more than the {MAX_IMAGE_PIXELS} an input image may have"
                    )
                with _truncated_images_refused():
                    image.load()
                return image.convert("RGB")
        except (Image.DecompressionBombWarning, Image.DecompressionBombError) as error:
            raise CheckpointError(f"{name}: refused as a possible decompression bomb: {error}") from None
        except UnidentifiedImageError:
            raise CheckpointError(f"{name}: not an image (no format Pillow reads recognises it)") from None
        except MALFORMED_IMAGE_ERRORS as error:
            raise CheckpointError(f"{name}: corrupt or truncated image ({error})") from None
