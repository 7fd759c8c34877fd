"""The Qwen3.5 vision tower's geometry at one image size: what its ``vision_config``
says, checked, and the shapes an exported tower is fixed at; and the tower as a graph
another kind reads (:data:`TOWER_GRAPH`: ``model.onnx`` and its geometry, ``tower.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgebuild.core.kind import Format
from edgebuild.errors import ParameterError

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint

VISUAL_PREFIX = "model.visual."
PREPROCESSOR_FILE = "preprocessor_config.json"
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
GEOMETRY_FILE = "tower.json"
# A float tower as one fixed-shape graph, with the geometry it is fixed at.
TOWER_GRAPH = Format("qwen3_5_tower_graph", "a fixed-shape Qwen3.5 vision tower graph",
                     (MODEL_FILE, WEIGHTS_FILE, GEOMETRY_FILE))

# The integer entries of vision_config the tower's shapes come from, and their defaults
# in Qwen3_5VisionConfig; each must be a positive integer.
VISION_INTEGERS = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
    "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
}


@dataclass(frozen=True)
class TowerGeometry:
    """The shapes an exported tower is fixed at."""

    height: int
    width: int
    grid_h: int
    grid_w: int
    patches: int
    patch_dim: int
    merged_tokens: int
    out_hidden_size: int

    @property
    def grid_thw(self) -> list[int]:
        return [1, self.grid_h, self.grid_w]


def check_vision_config(checkpoint: "Checkpoint") -> dict[str, Any]:
    """The checkpoint's ``vision_config``, once every integer the tower's shapes come
    from is a positive integer (a :class:`CheckpointError` naming the key otherwise)."""

    def check() -> dict[str, Any]:
        for key, default in VISION_INTEGERS.items():
            checkpoint.config_int("vision_config", key, default=default, minimum=1)
        return checkpoint.config_section("vision_config")

    return checkpoint.once(check_vision_config, check)


def tower_geometry(vision_config: dict[str, Any], image_size: tuple[int, int]) -> TowerGeometry:
    """Geometry at ``image_size``, or a :class:`ParameterError` naming the nearest valid sizes.
    ``vision_config`` has passed :func:`check_vision_config`."""
    patch = vision_config.get("patch_size", VISION_INTEGERS["patch_size"])
    merge = vision_config.get("spatial_merge_size", VISION_INTEGERS["spatial_merge_size"])
    step = patch * merge
    for axis, size in zip(("height", "width"), image_size):
        if size % step:
            below = (size // step) * step
            nearest = [candidate for candidate in (below, below + step) if candidate > 0]
            raise ParameterError(
                f"{axis} {size} is not a multiple of patch_size x spatial_merge_size "
                f"= {patch} x {merge} = {step}; nearest valid sizes: {', '.join(map(str, nearest))}"
            )
    grid_h, grid_w = image_size[0] // patch, image_size[1] // patch
    patches = grid_h * grid_w
    return TowerGeometry(
        height=image_size[0],
        width=image_size[1],
        grid_h=grid_h,
        grid_w=grid_w,
        patches=patches,
        patch_dim=vision_config.get("in_channels", VISION_INTEGERS["in_channels"])
        * vision_config.get("temporal_patch_size", VISION_INTEGERS["temporal_patch_size"]) * patch * patch,
        merged_tokens=patches // (merge * merge),
        out_hidden_size=vision_config.get("out_hidden_size", VISION_INTEGERS["out_hidden_size"]),
    )
