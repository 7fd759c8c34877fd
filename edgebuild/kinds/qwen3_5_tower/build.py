"""Building the tower: load it strictly, fix its shape, prove the fixed-shape module
reproduces the model's forward, export, sanitise."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from edgebuild.models.qwen3_5.geometry import GEOMETRY_FILE, VISUAL_PREFIX, tower_geometry
from edgebuild.models.qwen3_5.model import fixed_shape_tower_class, load_tower, sample_patches
from edgebuild.plugin import BuildContext, ExportError, Phases

from .params import MODEL_FILE, WRAPPER_TOLERANCE, TowerParams


def build(context: BuildContext[TowerParams]) -> dict[str, Any]:
    import torch

    from edgebuild.ml.onnx_tools import export_onnx, sanitize_allowzero

    params = context.params
    checkpoint = context.checkpoint
    geometry = tower_geometry(checkpoint.config_section("vision_config"), params.image_size)
    dtype = getattr(torch, params.dtype)
    phases = Phases()

    # The wrapper check runs in float32 whatever the export dtype; a float16 tower is
    # cast only after it (see _check_wrapper).
    with phases.time("load"):
        tower = load_tower(checkpoint, torch.float32, params.attn_implementation)
    context.log(f"loaded {len(checkpoint.select((VISUAL_PREFIX,)))} model.visual.* tensors as float32")

    with phases.time("wrapper_check"):
        module, example, identical, wrapper_max_abs = _check_wrapper(tower, geometry)
    context.log(
        f"fixed-shape wrapper vs Qwen3_5VisionModel.forward (float32): identical={identical} max_abs={wrapper_max_abs:.3e}"
    )
    if not identical and not wrapper_max_abs <= WRAPPER_TOLERANCE:
        raise ExportError(
            f"the fixed-shape wrapper does not reproduce Qwen3_5VisionModel.forward "
            f"(max abs {wrapper_max_abs:.3e} > {WRAPPER_TOLERANCE}); refusing to export"
        )
    if dtype != torch.float32:
        with phases.time("cast"):
            del module
            module = fixed_shape_tower_class()(_cast_weights(tower, dtype), geometry).eval()
            example = example.to(dtype)
        context.log(f"cast the checked tower to {params.dtype} for export")

    model_path = context.out_dir / MODEL_FILE
    with phases.time("export"):
        export_onnx(module, (example,), model_path, ["patches"], ["embeds"], params.opset)
    with phases.time("sanitize"):
        cleared = sanitize_allowzero(model_path)
    context.log(f"exported opset {params.opset}; cleared allowzero on {cleared} Reshape nodes")

    info = {
        "geometry": asdict(geometry) | {"grid_thw": geometry.grid_thw},
        "dtype": params.dtype,
        "opset": params.opset,
        "wrapper_check": {"identical": identical, "max_abs": wrapper_max_abs, "tolerance": WRAPPER_TOLERANCE,
                          "dtype": "float32"},
        "allowzero_cleared": cleared,
    }
    (context.out_dir / GEOMETRY_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info | {"timings": phases.seconds}


def _check_wrapper(tower: Any, geometry: Any) -> tuple[Any, Any, bool, float]:
    """The fixed-shape module of the float32 ``tower``, checked against the tower's own
    ``forward(pixel_values, grid_thw).pooler_output`` on one fixed-seed input.

    Why float32 for every export dtype: what can go wrong in fixing the shape is
    structural -- the interpolation indices and weights of the position embeddings,
    the rotary position ids, the attention segment boundaries, the order of blocks
    and merger -- and none of it depends on the dtype: the wrapper derives its
    buffers with the model's own helpers and formula, and its forward runs the
    model's own submodules. The float16 module is then made by the same code from
    the same tower, cast: its weights are the checkpoint's rounded to float16 once
    (exactly what loading in float16 gives), its buffers are derived from them as
    the model's float16 forward derives them, and the rotary cos/sin stay float32
    as the model keeps them. What a float16 check proved on top -- that the two paths
    also round alike -- is what verification measures anyway, on the exported graph,
    against the float32 model (the float16 thresholds). And float16 matmuls are slow
    on CPUs without native half precision: on the full-size tower the check took
    41 s in float16 against 12 s in float32, a third of the build.
    """
    import torch

    module = fixed_shape_tower_class()(tower, geometry).eval()
    example = sample_patches(geometry, 1, seed=0)[0]
    grid = torch.tensor([geometry.grid_thw], dtype=torch.long)
    with torch.no_grad():
        wrapped = module(example)
        reference = tower(example, grid).pooler_output
    identical = torch.equal(wrapped, reference)
    max_abs = (wrapped - reference).abs().max().item()
    return module, example, identical, max_abs


def _cast_weights(tower: Any, dtype: Any) -> Any:
    """``tower`` with the tensors the checkpoint filled cast to ``dtype``, one at a time
    (a second full copy never exists), and the buffers the module computes itself (the
    rotary frequencies, float32 whatever the dtype) as they are -- the same tower
    ``load_tower(checkpoint, dtype)`` gives."""
    import torch

    loaded = set(tower.state_dict())
    with torch.no_grad():
        for name, parameter in tower.named_parameters():
            if name in loaded and parameter.is_floating_point():
                parameter.data = parameter.data.to(dtype)
        for module_name, module in tower.named_modules():
            for buffer_name, buffer in list(module.named_buffers(recurse=False)):
                full = f"{module_name}.{buffer_name}" if module_name else buffer_name
                if full in loaded and buffer.is_floating_point():
                    setattr(module, buffer_name, buffer.to(dtype))
    return tower
