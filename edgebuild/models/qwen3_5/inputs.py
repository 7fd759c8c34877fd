"""The tower's inputs from images and SafeTensors files: one ``[patches, patch_dim]``
float32 array per image, exactly what the exported tower's ``patches`` input takes.
Images go through the checkpoint's image processor's steps (``images.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from edgebuild.core.inputs import expand_inputs
from edgebuild.core.kind import InputFiles
from edgebuild.errors import CheckpointError
from edgebuild.models.qwen3_5.images import images_to_patches, patch_preprocessing

if TYPE_CHECKING:
    import numpy

    from edgebuild.core.checkpoint import Checkpoint

# The graph's input: one image's patches, [patches, patch_dim].
PATCHES_INPUT = "patches"


class TowerInputs(InputFiles):
    """Inputs of the tower: images (paths or globs, relative to the manifest), each
    run through the checkpoint's own image processor at the tower's size, and/or
    SafeTensors files holding a ``patches`` tensor of ``[n * patches, patch_dim]``
    or ``[n, patches, patch_dim]`` (n images already turned into patches)."""

    images: list[str] = Field(
        default_factory=list,
        description="Images (paths or globs), through the checkpoint's image processor at the tower's size.",
    )
    patches: list[str] = Field(
        default_factory=list,
        description="SafeTensors files with a patches tensor [patches, patch_dim] or [n, patches, patch_dim].",
    )


def tower_inputs(inputs: TowerInputs, root: Path, checkpoint: "Checkpoint", geometry: dict[str, Any], what: str) -> list["numpy.ndarray"]:
    """Every input as ``[patches, patch_dim]`` float32: patches files first, then images,
    each in the order its pattern lists them."""
    samples = []
    for path in expand_inputs(inputs.patches, root, f"{what}.patches"):
        samples.extend(_patches_file(path, geometry))
    images = expand_inputs(inputs.images, root, f"{what}.images")
    if images:
        preprocessing = patch_preprocessing(checkpoint)
        samples.extend(images_to_patches(preprocessing, images, geometry))
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
