"""Building the tower: load it strictly, fix its shape, prove the fixed-shape module
reproduces the model's forward, export, sanitise."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from ...errors import ExportError
from ...timing import Phases
from ..base import BuildContext
from .model import fixed_shape_tower_class, load_tower, sample_patches
from .params import GEOMETRY_FILE, MODEL_FILE, VISUAL_PREFIX, WRAPPER_TOLERANCE, TowerParams, tower_geometry


def build(context: BuildContext) -> dict[str, Any]:
    import torch

    from ...onnx_tools import export_onnx, sanitize_allowzero

    params = context.params
    assert isinstance(params, TowerParams)
    checkpoint = context.checkpoint
    geometry = tower_geometry(checkpoint.config_section("vision_config"), params.image_size)
    dtype = getattr(torch, params.dtype)
    phases = Phases()

    with phases.time("load"):
        tower = load_tower(checkpoint, dtype, params.attn_implementation)
        module = fixed_shape_tower_class()(tower, geometry).eval()
    context.log(f"loaded {len(checkpoint.select((VISUAL_PREFIX,)))} model.visual.* tensors as {params.dtype}")

    with phases.time("wrapper_check"):
        example = sample_patches(geometry, 1, seed=0)[0].to(dtype)
        grid = torch.tensor([geometry.grid_thw], dtype=torch.long)
        with torch.no_grad():
            wrapped = module(example)
            reference = tower(example, grid).pooler_output
        identical = torch.equal(wrapped, reference)
        wrapper_max_abs = (wrapped.float() - reference.float()).abs().max().item()
    context.log(f"fixed-shape wrapper vs Qwen3_5VisionModel.forward: identical={identical} max_abs={wrapper_max_abs:.3e}")
    if not identical and not wrapper_max_abs <= WRAPPER_TOLERANCE:
        raise ExportError(
            f"the fixed-shape wrapper does not reproduce Qwen3_5VisionModel.forward "
            f"(max abs {wrapper_max_abs:.3e} > {WRAPPER_TOLERANCE}); refusing to export"
        )

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
        "wrapper_check": {"identical": identical, "max_abs": wrapper_max_abs, "tolerance": WRAPPER_TOLERANCE},
        "allowzero_cleared": cleared,
    }
    (context.out_dir / GEOMETRY_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info | {"timings": phases.seconds}
