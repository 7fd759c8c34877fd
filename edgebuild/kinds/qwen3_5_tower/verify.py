"""Verifying the tower: onnxruntime on the exported graph against the model's own
forward in float32, the graph's shapes and ops, and where each provider places it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from edgebuild.ml.compare import compare_outputs, worst_case
from edgebuild.models.qwen3_5.geometry import tower_geometry
from edgebuild.models.qwen3_5.model import load_tower, sample_patches
from edgebuild.plugin import Check, Runner, TensorSpec, Verification, VerifyContext

from .params import MODEL_FILE, WRAPPER_TOLERANCE, TowerParams

# Fixed |error| bin edges for the histogram the report page draws: half decades from
# 1e-8 to 1e2, so histograms of different builds and dtypes line up bin for bin.
ERROR_HISTOGRAM_EDGES = [10.0 ** (exponent / 2) for exponent in range(-16, 5)]


def verify(context: VerifyContext[TowerParams]) -> Verification:
    import numpy
    import torch

    from edgebuild.ml.onnx_tools import graph_summary, provider_placement, run_session

    params = context.params
    limits = params.limits()
    checkpoint = context.checkpoint
    vision_config = checkpoint.config_section("vision_config")
    geometry = tower_geometry(vision_config, params.image_size)
    merge = vision_config.get("spatial_merge_size", 2)
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
    token_max_abs = None
    histogram_counts = numpy.zeros(len(ERROR_HISTOGRAM_EDGES) + 1, dtype=numpy.int64)
    with torch.no_grad():
        for sample, (embeds,) in zip(inputs, outputs):
            reference = reference_tower(sample, grid).pooler_output
            actual = torch.from_numpy(embeds.astype(numpy.float32))
            comparisons.append(compare_outputs(reference[None], actual[None]))
            error = (actual.double() - reference.double()).abs().numpy()
            sample_token_max = error.max(axis=-1)
            token_max_abs = sample_token_max if token_max_abs is None else numpy.maximum(token_max_abs, sample_token_max)
            # Bin 0 holds |error| below the first edge, the last bin at or above the last edge (and NaN).
            histogram_counts += numpy.bincount(numpy.searchsorted(ERROR_HISTOGRAM_EDGES, error.ravel(), side="right"),
                                               minlength=len(histogram_counts))
    del reference_tower
    measured = worst_case(comparisons)
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
        # What the report page draws: merged tokens are row-major over the merged grid.
        "token_errors": {
            "grid": [geometry.grid_h // merge, geometry.grid_w // merge],
            "max_abs": [float(f"{value:.4g}") for value in token_max_abs.tolist()],
            "histogram": {"edges": ERROR_HISTOGRAM_EDGES, "counts": histogram_counts.tolist()},
        },
    }
    return Verification(checks=checks, metrics=metrics)


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def float_model(context: VerifyContext[TowerParams]) -> Runner:
    """``Qwen3_5VisionModel.forward(patches, grid_thw).pooler_output`` in float32 at the
    tower's grid: the reference of every artifact made from this tower (its QDQ graph,
    the QNN context compiled from that)."""
    import torch
    import transformers

    from edgebuild.targets.runners import torch_runner

    params = context.params
    geometry = tower_geometry(context.checkpoint.config_section("vision_config"), params.image_size)
    tower = load_tower(context.checkpoint, torch.float32, params.attn_implementation)
    grid = torch.tensor([geometry.grid_thw], dtype=torch.long)

    def forward(patches: "torch.Tensor") -> "torch.Tensor":
        return tower(patches, grid).pooler_output

    return torch_runner(forward, [TensorSpec("patches", (geometry.patches, geometry.patch_dim), "float32")], ["embeds"],
                        f"transformers {transformers.__version__} Qwen3_5VisionModel.forward(float32).pooler_output",
                        model=tower)


def image_feeds(context: VerifyContext[TowerParams], images: list[Any]) -> list[dict[str, Any]]:
    """Images through the checkpoint's ``Qwen2VLImageProcessor`` steps at the tower's size."""
    import numpy

    from edgebuild.models.qwen3_5.images import image_patches, patch_preprocessing

    params = context.params
    geometry = asdict(tower_geometry(context.checkpoint.config_section("vision_config"), params.image_size))
    dtype = numpy.float16 if params.dtype == "float16" else numpy.float32
    preprocessing = patch_preprocessing(context.checkpoint)
    # One image at a time: a dataset of hundreds holds only its feeds, in their dtype.
    return [{"patches": image_patches(preprocessing, image, geometry).astype(dtype)} for image in images]
