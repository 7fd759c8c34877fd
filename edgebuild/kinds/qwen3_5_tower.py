"""Kind ``qwen3_5_vision_tower``: a Qwen3.5 vision tower as one fixed-shape ONNX graph.

The model definition is transformers' own ``Qwen3_5VisionModel``; nothing here
re-writes it. :class:`FixedShapeTower` holds the real module and only fixes its
input shape: everything ``forward`` derives from ``grid_thw`` (interpolated
position embeddings, rotary cos/sin, attention segment boundaries) is a
function of the grid alone, so at one image size it is computed once and kept
as buffers. The exported graph then has no integer ``Gather`` -- the op most
likely to have no kernel on a DirectML or NPU backend.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from ..errors import CheckpointError, ExportError, ParameterError
from ..report import Check
from . import register
from .base import ArtifactKind, ArtifactParams, BuildContext, Dtype, Strict, TensorSelection, Verification, VerifyContext

if TYPE_CHECKING:
    import torch

    from ..checkpoint import Checkpoint

VISUAL_PREFIX = "model.visual."
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
GEOMETRY_FILE = "tower.json"
# The fixed-shape module must reproduce the model's own forward this closely
# (or exactly) before it is exported; anything looser exports a different model.
WRAPPER_TOLERANCE = 1e-4

# Per-dtype defaults for the manifest's ``verify:`` thresholds, against the
# float32 model's own forward. float16 figures measured on the tiny fixture:
# see the README's reference section.
DEFAULT_LIMITS: dict[str, dict[str, float]] = {
    "float32": {"cosine_min": 0.9999, "max_abs": 1e-4, "mean_abs": 1e-5},
    "float16": {"cosine_min": 0.999, "max_abs": 1e-2, "mean_abs": 1e-3},
}


def _normalise_image_size(value: Any) -> Any:
    return [value, value] if isinstance(value, int) and not isinstance(value, bool) else value


class TowerVerify(Strict):
    """Thresholds of ``verify:``; unset ones take the per-dtype defaults."""

    cosine_min: float | None = Field(default=None, ge=-1.0, le=1.0)
    max_abs: float | None = Field(default=None, ge=0.0)
    mean_abs: float | None = Field(default=None, ge=0.0)
    samples: int = Field(default=2, ge=1, le=64, description="Random inputs compared.")
    seed: int = 0
    providers: list[str] = Field(
        default_factory=lambda: ["CPUExecutionProvider"],
        description="onnxruntime execution providers whose node placement is checked.",
    )
    min_provider_fraction: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Share of executed nodes that must run on each provider."
    )
    max_gather_nodes: int = Field(default=0, ge=0, description="Gather nodes allowed in the graph.")


class TowerParams(ArtifactParams):
    kind: Literal["qwen3_5_vision_tower"]
    checkpoint: str
    image_size: Annotated[tuple[int, int], BeforeValidator(_normalise_image_size)] = Field(
        description="Image side in pixels, or [height, width]."
    )
    dtype: Dtype = "float32"
    opset: int = Field(default=21, ge=18, description="ONNX opset (16-bit QDQ needs 21).")
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    verify: TowerVerify = Field(default_factory=TowerVerify)

    @field_validator("image_size")
    @classmethod
    def _positive(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) <= 0:
            raise ValueError("image sizes must be positive")
        return value

    def limits(self) -> dict[str, float]:
        defaults = DEFAULT_LIMITS[self.dtype]
        return {key: getattr(self.verify, key) if getattr(self.verify, key) is not None else defaults[key] for key in defaults}


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


def tower_geometry(vision_config: dict[str, Any], image_size: tuple[int, int]) -> TowerGeometry:
    """Geometry at ``image_size``, or a :class:`ParameterError` naming the nearest valid sizes."""
    patch = vision_config.get("patch_size", 16)
    merge = vision_config.get("spatial_merge_size", 2)
    if not isinstance(patch, int) or not isinstance(merge, int):
        raise CheckpointError(f"vision_config: expected integer patch_size and spatial_merge_size, found {patch!r}, {merge!r}")
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
        patch_dim=vision_config.get("in_channels", 3) * vision_config.get("temporal_patch_size", 2) * patch * patch,
        merged_tokens=patches // (merge * merge),
        out_hidden_size=vision_config.get("out_hidden_size", 3584),
    )


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


def _fixed_shape_tower_class() -> type:
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


def compare_outputs(reference: "torch.Tensor", actual: "torch.Tensor") -> dict[str, float]:
    import torch

    reference, actual = reference.double(), actual.double()
    error = (actual - reference).abs()
    return {
        "max_abs": error.max().item(),
        "mean_abs": error.mean().item(),
        "cosine": torch.nn.functional.cosine_similarity(actual.flatten(), reference.flatten(), dim=0).item(),
        "min_token_cosine": torch.nn.functional.cosine_similarity(actual, reference, dim=-1).min().item(),
    }


@register
class Qwen3_5VisionTower(ArtifactKind):
    name = "qwen3_5_vision_tower"
    summary = "Qwen3.5 vision tower -> fixed-shape ONNX"
    Params = TowerParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, GEOMETRY_FILE)

    def tensor_selection(self, params: ArtifactParams) -> TensorSelection:
        return TensorSelection(prefixes=(VISUAL_PREFIX,), config_key="vision_config")

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, "Checkpoint"]) -> None:
        assert isinstance(params, TowerParams)
        checkpoint = checkpoints[params.checkpoint]
        try:
            tower_geometry(checkpoint.config_section("vision_config"), params.image_size)
        except ParameterError as error:
            raise ParameterError(f"{error} (vision_config of {checkpoint.label})", key="image_size") from None

    def build(self, context: BuildContext) -> dict[str, Any]:
        import json

        import torch

        from ..onnx_tools import export_onnx

        params = context.params
        assert isinstance(params, TowerParams)
        checkpoint = context.checkpoint
        geometry = tower_geometry(checkpoint.config_section("vision_config"), params.image_size)
        dtype = getattr(torch, params.dtype)
        timings: dict[str, float] = {}

        started = time.perf_counter()
        tower = load_tower(checkpoint, dtype, params.attn_implementation)
        module = _fixed_shape_tower_class()(tower, geometry).eval()
        timings["load_s"] = time.perf_counter() - started
        context.log(f"loaded {len(checkpoint.select((VISUAL_PREFIX,)))} model.visual.* tensors as {params.dtype}")

        started = time.perf_counter()
        example = sample_patches(geometry, 1, seed=0)[0].to(dtype)
        grid = torch.tensor([geometry.grid_thw], dtype=torch.long)
        with torch.no_grad():
            wrapped = module(example)
            reference = tower(example, grid).pooler_output
        identical = torch.equal(wrapped, reference)
        wrapper_max_abs = (wrapped.float() - reference.float()).abs().max().item()
        timings["wrapper_check_s"] = time.perf_counter() - started
        context.log(f"fixed-shape wrapper vs Qwen3_5VisionModel.forward: identical={identical} max_abs={wrapper_max_abs:.3e}")
        if not identical and not wrapper_max_abs <= WRAPPER_TOLERANCE:
            raise ExportError(
                f"the fixed-shape wrapper does not reproduce Qwen3_5VisionModel.forward "
                f"(max abs {wrapper_max_abs:.3e} > {WRAPPER_TOLERANCE}); refusing to export"
            )

        started = time.perf_counter()
        model_path = context.out_dir / MODEL_FILE
        export_onnx(module, (example,), model_path, ["patches"], ["embeds"], params.opset)
        timings["export_s"] = time.perf_counter() - started

        started = time.perf_counter()
        from ..onnx_tools import sanitize_allowzero

        cleared = sanitize_allowzero(model_path)
        timings["sanitize_s"] = time.perf_counter() - started
        context.log(f"exported opset {params.opset}; cleared allowzero on {cleared} Reshape nodes")

        info = {
            "geometry": asdict(geometry) | {"grid_thw": geometry.grid_thw},
            "dtype": params.dtype,
            "opset": params.opset,
            "wrapper_check": {"identical": identical, "max_abs": wrapper_max_abs, "tolerance": WRAPPER_TOLERANCE},
            "allowzero_cleared": cleared,
            "timings": timings,
        }
        (context.out_dir / GEOMETRY_FILE).write_text(json.dumps(info, indent=2) + "\n")
        return info

    def verify(self, context: VerifyContext) -> Verification:
        import numpy
        import torch

        from ..onnx_tools import graph_summary, provider_placement, run_session

        params = context.params
        assert isinstance(params, TowerParams)
        limits = params.limits()
        checkpoint = context.checkpoint
        geometry = tower_geometry(checkpoint.config_section("vision_config"), params.image_size)
        model_path = context.out_dir / MODEL_FILE
        summary = graph_summary(model_path)

        grid = torch.tensor([geometry.grid_thw], dtype=torch.long)
        inputs = sample_patches(geometry, params.verify.samples, params.verify.seed)
        numpy_dtype = numpy.float16 if params.dtype == "float16" else numpy.float32
        # The session and the reference model each hold a float32 copy of the
        # weights: one after the other, never both at once.
        outputs = run_session(model_path, [{"patches": sample.numpy().astype(numpy_dtype)} for sample in inputs])
        # The reference is the model's own forward in float32 -- not the wrapper,
        # and not the artifact's dtype: what a user deploys is compared with the
        # model they trained.
        reference_tower = load_tower(checkpoint, torch.float32, params.attn_implementation)
        comparisons = []
        with torch.no_grad():
            for sample, (embeds,) in zip(inputs, outputs):
                reference = reference_tower(sample, grid).pooler_output
                comparisons.append(compare_outputs(reference, torch.from_numpy(embeds.astype(numpy.float32))))
        del reference_tower
        measured = {
            "max_abs": max(item["max_abs"] for item in comparisons),
            "mean_abs": sum(item["mean_abs"] for item in comparisons) / len(comparisons),
            "cosine": min(item["cosine"] for item in comparisons),
            "min_token_cosine": min(item["min_token_cosine"] for item in comparisons),
        }
        reference_note = "onnxruntime CPU vs Qwen3_5VisionModel.forward(float32).pooler_output"
        expected_dtype = "float16" if params.dtype == "float16" else "float"
        checks = [
            Check.measure("cosine", measured["cosine"], ">=", limits["cosine_min"], reference_note),
            Check.measure("max_abs", measured["max_abs"], "<=", limits["max_abs"], reference_note),
            Check.measure("mean_abs", measured["mean_abs"], "<=", limits["mean_abs"], reference_note),
            Check.measure(
                "input_shape",
                [summary["inputs"][0]["name"], summary["inputs"][0]["dtype"], summary["inputs"][0]["shape"]],
                "==",
                ["patches", expected_dtype, [geometry.patches, geometry.patch_dim]],
            ),
            Check.measure(
                "output_shape",
                [summary["outputs"][0]["name"], summary["outputs"][0]["dtype"], summary["outputs"][0]["shape"]],
                "==",
                ["embeds", expected_dtype, [geometry.merged_tokens, geometry.out_hidden_size]],
            ),
            Check.measure("allowzero_reshapes", summary["allowzero_reshapes"], "==", 0),
            Check.measure("gather_nodes", summary["ops"].get("Gather", 0), "<=", params.verify.max_gather_nodes),
            Check.measure(
                "wrapper_max_abs",
                context.build_info["wrapper_check"]["max_abs"],
                "<=",
                WRAPPER_TOLERANCE,
                "fixed-shape wrapper vs Qwen3_5VisionModel.forward, at build time",
            ),
        ]
        placements = []
        feed = {"patches": inputs[0].numpy().astype(numpy_dtype)}
        for provider in params.verify.providers:
            placement = provider_placement(model_path, provider, feed)
            placements.append(placement)
            if placement["available"]:
                detail = "kernels placed: " + ", ".join(f"{name} {count}" for name, count in placement["nodes"].items())
            else:
                detail = f"provider unavailable here (available: {', '.join(placement['available_providers'])})"
            checks.append(
                Check.measure(f"provider:{provider}", placement["fraction"], ">=", params.verify.min_provider_fraction, detail)
            )
        metrics = {
            "comparison": measured | {"reference": reference_note, "samples": comparisons},
            "graph": summary,
            "providers": placements,
        }
        return Verification(checks=checks, metrics=metrics)
