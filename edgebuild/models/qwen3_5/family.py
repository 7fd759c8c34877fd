"""The Qwen3.5 vision tower as a model family. ``model_class: Qwen3_5VisionModel`` is
transformers' tower at a fixed ``image_size`` through its fixed-shape wrapper, its input
the processor's ``patches``, its output the merged tokens, ``embeds``."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from edgebuild.core.kind import TensorSelection
from edgebuild.core.runner import TensorSpec
from edgebuild.errors import ParameterError
from edgebuild.models.family import Family
from edgebuild.models.qwen3_5.geometry import PREPROCESSOR_FILE, VISUAL_PREFIX, check_vision_config, tower_geometry

if TYPE_CHECKING:
    import torch

    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.models.fields import ModelFields


class TowerFamily(Family):
    """The Qwen3.5 vision tower at a fixed image size."""

    name = "qwen3_5_vision_tower"
    default_outputs = ("embeds",)

    def check(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        if params.image_size is None:
            raise ParameterError("the Qwen3.5 tower (model_class: Qwen3_5VisionModel) needs image_size", key="image_size")
        if params.inputs is not None:
            raise ParameterError("the Qwen3.5 tower's input follows from image_size (its patches): leave inputs out",
                                 key="inputs")
        if self.outputs(params) != ["embeds"]:
            raise ParameterError("the Qwen3.5 tower has one output, embeds (its merged tokens)", key="outputs")
        if params.submodule is not None:
            raise ParameterError("the Qwen3.5 tower is exported whole: leave submodule out", key="submodule")
        vision = check_vision_config(checkpoint)
        try:
            tower_geometry(vision, params.image_size)
        except ParameterError as error:
            raise ParameterError(f"{error} (vision_config of {checkpoint.label})", key="image_size") from None

    def _geometry(self, params: "ModelFields", checkpoint: "Checkpoint") -> Any:
        assert params.image_size is not None
        return tower_geometry(checkpoint.config_section("vision_config"), params.image_size)

    def selection(self, params: "ModelFields", checkpoint: "Checkpoint") -> TensorSelection:
        files = (PREPROCESSOR_FILE,) if checkpoint.has_file(PREPROCESSOR_FILE) else ()
        return TensorSelection(prefixes=(VISUAL_PREFIX,), config_key="vision_config", files=files)

    def inputs(self, params: "ModelFields", checkpoint: "Checkpoint") -> list[TensorSpec]:
        geometry = self._geometry(params, checkpoint)
        return [TensorSpec("patches", (geometry.patches, geometry.patch_dim), params.dtype)]

    def module(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        import torch

        from edgebuild.models.qwen3_5.model import fixed_shape_tower_class, linear_patch_embedding, load_tower

        tower = load_tower(checkpoint, torch.float32, params.attn_implementation or "sdpa")
        # The patch embedding is a Conv3d whose kernel is its stride is the whole patch: on the
        # flattened patches it is one matrix product, the same numbers (a 5-D convolution is
        # what ExecuTorch's portable kernels and XNNPACK lack).
        tower.patch_embed = linear_patch_embedding(tower.patch_embed)
        wrapper = fixed_shape_tower_class()(tower, self._geometry(params, checkpoint)).eval()

        class Outputs(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, patches: Any) -> tuple[Any, ...]:
                return (self.inner(patches),)

        return Outputs(wrapper).eval()

    def reference(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        """``Qwen3_5VisionModel.forward(patches, grid_thw).pooler_output`` itself, in float32."""
        import torch

        from edgebuild.models.qwen3_5.model import load_tower

        tower = load_tower(checkpoint, torch.float32, params.attn_implementation or "sdpa")
        grid = torch.tensor([self._geometry(params, checkpoint).grid_thw], dtype=torch.long)

        class Forward(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, patches: Any) -> tuple[Any, ...]:
                return (self.inner(patches, grid).pooler_output,)

        return Forward(tower).eval()

    def examples(self, params: "ModelFields", checkpoint: "Checkpoint", shapes: dict[str, list[int]], count: int,
                 seed: int) -> list[tuple[Any, ...]]:
        from edgebuild.models.qwen3_5.model import sample_patches

        return [(patches,) for patches in sample_patches(self._geometry(params, checkpoint), count, seed)]

    def image_feeds(self, params: "ModelFields", checkpoint: "Checkpoint", images: list[Any]) -> list[dict[str, Any]]:
        from edgebuild.models.qwen3_5.images import image_patches, patch_preprocessing

        geometry = asdict(self._geometry(params, checkpoint))
        preprocessing = patch_preprocessing(checkpoint)
        return [{"patches": image_patches(preprocessing, image, geometry).astype(params.dtype)} for image in images]
