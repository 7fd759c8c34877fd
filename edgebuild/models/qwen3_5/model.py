"""The tower as transformers defines it, loaded strictly, and fixed at one image size.

:class:`FixedShapeTower` holds the real ``Qwen3_5VisionModel`` and only fixes its
input shape: everything ``forward`` derives from ``grid_thw`` (interpolated
position embeddings, rotary cos/sin, attention segment boundaries) is a function
of the grid alone, so at one image size it is computed once and kept as
buffers. The exported graph then has no integer ``Gather`` -- the op most likely
to have no kernel on a DirectML or NPU backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebuild.errors import CheckpointError
from edgebuild.models.qwen3_5.geometry import VISUAL_PREFIX, TowerGeometry

if TYPE_CHECKING:
    import torch

    from edgebuild.core.checkpoint import Checkpoint


def load_tower(checkpoint: "Checkpoint", dtype: "torch.dtype", attn_implementation: str = "sdpa") -> Any:
    """transformers' ``Qwen3_5VisionModel`` with exactly the checkpoint's ``model.visual.*`` tensors.

    Strict: a half-loaded tower exports cleanly and computes plausible garbage,
    so any missing or unexpected tensor is an error.
    """
    import torch
    from transformers.models.qwen3_5 import Qwen3_5VisionConfig, Qwen3_5VisionModel

    config = Qwen3_5VisionConfig(**checkpoint.config_section("vision_config"))
    config._attn_implementation = attn_implementation
    entries = checkpoint.select((VISUAL_PREFIX,))
    # Built on the meta device and then given the loaded tensors themselves
    # (``assign=True``): no random initialisation, and no second copy of the
    # weights. Measured on the 461 M-parameter tower in float32: peak RSS while
    # loading fell from 2.2x the weights to about 1x.
    with torch.device("meta"):
        tower = Qwen3_5VisionModel(config)
    state = checkpoint.load(entries, strip_prefix=VISUAL_PREFIX, dtype=dtype)
    missing, unexpected = tower.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint.label}: the model.visual.* tensors do not match Qwen3_5VisionModel: "
            f"missing {_listing(missing)}; unexpected {_listing(unexpected)}"
        )
    # The rotary frequencies are non-persistent buffers, computed by the module
    # itself (never read from the checkpoint), and kept in float32: the model
    # computes cos/sin in float32 whatever its dtype, and so does the wrapper.
    rotary = tower.rotary_pos_emb
    frequencies, _ = type(rotary).compute_axial_rope_parameters(config, device="cpu")
    rotary.inv_freq = frequencies.to(torch.float32)
    rotary.original_inv_freq = frequencies.to(torch.float32).clone()
    left_on_meta = [name for name, tensor in [*tower.named_parameters(), *tower.named_buffers()] if tensor.is_meta]
    if left_on_meta:
        raise CheckpointError(f"{checkpoint.label}: Qwen3_5VisionModel has tensors no checkpoint entry filled: {_listing(left_on_meta)}")
    return tower.eval()


def _listing(names: list[str], limit: int = 5) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return f"{len(names)} ({shown}{', ...' if len(names) > limit else ''})"


def fixed_shape_tower_class() -> type:
    import torch
    from torch import nn
    from transformers.vision_utils import (
        get_vision_attention_seqlens,
        get_vision_interpolation_indices_and_weights,
        get_vision_position_ids,
    )

    class FixedShapeTower(nn.Module):
        """The tower at one image size, with its index arithmetic folded into buffers."""

        def __init__(self, tower: nn.Module, geometry: TowerGeometry) -> None:
            super().__init__()
            self.tower = tower
            self.geometry = geometry
            grid = torch.tensor([geometry.grid_thw], dtype=torch.long)
            with torch.no_grad():
                indices, weights = get_vision_interpolation_indices_and_weights(
                    grid,
                    num_grid_per_side=tower.num_grid_per_side,
                    mode=tower.interpolation_mode,
                    align_corners=tower.interpolation_align_corners,
                    spatial_merge_size=tower.config.spatial_merge_size,
                )
                position_ids = get_vision_position_ids(grid, tower.spatial_merge_size)
                cu_seqlens, _ = get_vision_attention_seqlens(grid, tower.config)
                # The same arithmetic, in the same dtypes, as Qwen3_5VisionModel.forward.
                pos_embeds = (tower.pos_embed(indices) * weights[:, :, None]).sum(1)
                dtype = tower.patch_embed.proj.weight.dtype
                cos, sin = tower.rotary_pos_emb(pos_embeds, position_ids)
            self.register_buffer("pos_embeds", pos_embeds.to(dtype), persistent=False)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
            # One image is one attention segment: [0, patches].
            self.register_buffer("cu_seqlens", cu_seqlens, persistent=False)

        def forward(self, patches: torch.Tensor) -> torch.Tensor:
            """``[patches, patch_dim]`` -> ``[merged_tokens, out_hidden_size]``."""
            hidden = self.tower.patch_embed(patches)
            hidden = hidden + self.pos_embeds
            for block in self.tower.blocks:
                hidden = block(hidden, cu_seqlens=self.cu_seqlens, position_embeddings=(self.rope_cos, self.rope_sin))
            return self.tower.merger(hidden)

    return FixedShapeTower


def sample_patches(geometry: TowerGeometry, count: int, seed: int) -> list["torch.Tensor"]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(geometry.patches, geometry.patch_dim, generator=generator) for _ in range(count)]


def linear_patch_embedding(embedding: Any) -> Any:
    """``Qwen3_5VisionPatchEmbed`` as a linear layer: the convolution's weight flattened in the
    order its ``view`` of the patches takes them (a leaf tensor of its own, as a program's
    parameters must be)."""
    import torch

    weight = embedding.proj.weight
    linear = torch.nn.Linear(weight[0].numel(), weight.shape[0], bias=embedding.proj.bias is not None,
                             dtype=weight.dtype, device="meta")
    linear.weight = torch.nn.Parameter(weight.detach().reshape(weight.shape[0], -1).clone(), requires_grad=False)
    if embedding.proj.bias is not None:
        linear.bias = torch.nn.Parameter(embedding.proj.bias.detach().clone(), requires_grad=False)

    class LinearPatchEmbed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = linear

        def forward(self, hidden_states: Any) -> Any:
            return self.proj(hidden_states.to(dtype=self.proj.weight.dtype))

    return LinearPatchEmbed()
