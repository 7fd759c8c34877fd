"""Verifying ``siglip_f143``: a strict reload, every weight on its tile's F143 grid,
the packed form bit for bit, and the quantized encoder against the float one on
the calibration and held-out inputs."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.compare import compare_outputs, worst_case
from edgebuild.plugin import Check, Inputs, Runner, TensorSpec, Verification, VerifyContext
from edgebuild.models.siglip.model import encoder_outputs, load_pixel_batches, load_vision_model, outputs_digest, vision_settings
from .packed import EXPONENT_SUFFIX, load_packed, stored_bytes
from .params import MODEL_FILE, PACKED_FILE, REPORT_FILE, SiglipF143Params


def verify(context: VerifyContext[SiglipF143Params]) -> Verification:
    import torch
    from safetensors import safe_open
    from transformers import SiglipVisionConfig, SiglipVisionModel
    from transformers.initialization import no_init_weights

    from edgebuild.ml.quant.f143 import off_grid_count, tile_exponents

    params = context.params
    out = context.out_dir
    report = json.loads((out / REPORT_FILE).read_text())
    checkpoint = context.checkpoint
    float_model, config = load_vision_model(checkpoint)
    with no_init_weights():
        # The written config.json, as a user of the directory would read it.
        written = json.loads((out / "config.json").read_text())
        quantized_model = SiglipVisionModel(SiglipVisionConfig(**vision_settings(written)))
    with safe_open(str(out / MODEL_FILE), framework="pt") as source:
        saved = {name: source.get_tensor(name) for name in source.keys()}
        metadata = source.metadata() or {}
    missing, unexpected = quantized_model.load_state_dict(saved, strict=False)
    quantized_model.eval()
    checks = [
        Check.measure("strict_reload", len(missing) + len(unexpected), "==", 0,
                      f"SiglipVisionModel.load_state_dict: missing {missing[:3]}, unexpected {unexpected[:3]}"),
        Check.measure("metadata_algorithm", metadata.get("ipu_f143_reconstruction"), "==", params.algorithm),
    ]

    off_grid = 0
    for name in report["quantized_linears"]:
        off_grid += off_grid_count(saved[name], tile_exponents(saved[name], params.block_size), params.block_size)
    checks.append(Check.measure("off_grid_weights", off_grid, "==", 0,
                                f"every weight of {len(report['quantized_linears'])} linears / its tile scale is an F143 value"))

    packed = load_packed(out / PACKED_FILE)
    mismatched = [name for name in saved if name not in packed or saved[name].dtype != packed[name].dtype
                  or not torch.equal(saved[name].view(torch.uint8) if saved[name].dtype == torch.float32 else saved[name],
                                     packed[name].view(torch.uint8) if packed[name].dtype == torch.float32 else packed[name])]
    checks.append(Check.measure("packed_round_trip_mismatches", len(mismatched), "==", 0,
                                "unpacked model.f143.safetensors vs model.safetensors, bit for bit"))
    float_bytes = sum(saved[name].numel() * 4 for name in report["quantized_linears"])
    with safe_open(str(out / PACKED_FILE), framework="pt") as source:
        packed_bytes = sum(
            stored_bytes(source, name)
            for name in source.keys()
            if name.removesuffix(EXPONENT_SUFFIX) in report["quantized_linears"]
        )

    device = torch.device("cpu")
    batches = load_pixel_batches(params.calibration, context.input_root, checkpoint, "calibration")
    held_out = load_pixel_batches(params.held_out, context.input_root, checkpoint, "held_out")
    metrics_summary: dict[str, Any] = {}
    image_cosines: dict[str, list[float]] = {}
    for label, inputs, digest_key in (("calibration", batches, "calibration_outputs_digest"),
                                      ("held_out", held_out, "held_out_outputs_digest")):
        if not inputs:
            continue
        references = encoder_outputs(float_model, inputs, device)
        outputs = encoder_outputs(quantized_model, inputs, device)
        summary = worst_case([compare_outputs(reference, output) for reference, output in zip(references, outputs)])
        metrics_summary[label] = summary
        # One cosine per image (the per-sample cosine compare_outputs averages), for the report page.
        image_cosines[label] = [compare_outputs(reference[index:index + 1], output[index:index + 1])["cosine"]
                                for reference, output in zip(references, outputs) for index in range(len(reference))]
        checks.append(Check.measure(f"{label}.cosine", summary["cosine"], ">=", params.verify.cosine_min,
                                    "quantized vs float SiglipVisionModel last_hidden_state, worst batch"))
        if params.verify.mean_abs is not None:
            checks.append(Check.measure(f"{label}.mean_abs", summary["mean_abs"], "<=", params.verify.mean_abs))
        if params.verify.max_abs is not None:
            checks.append(Check.measure(f"{label}.max_abs", summary["max_abs"], "<=", params.verify.max_abs))
        checks.append(Check.measure(f"{label}.reload_reproduces_build", outputs_digest(outputs), "==", report[digest_key],
                                    "digest of the reloaded model's outputs vs the in-memory model's at build time"))
    return Verification(
        checks=checks,
        metrics={
            "outputs": metrics_summary,
            "image_cosines": image_cosines,
            "objective_ratio": report["objective_ratio"],
            "packed_weight_bytes": packed_bytes,
            "float32_weight_bytes": float_bytes,
            "packed_ratio": packed_bytes / float_bytes if float_bytes else 0.0,
            "saturated_weights": sum(report["saturated_weights"].values()),
        },
    )


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def _encoder_runner(model: Any, image_size: int, description: str) -> Runner:
    """A SigLIP vision model as a runner: ``pixel_values`` of one image in, its
    ``last_hidden_state`` (and ``pooler_output``, with a head) out; positions interpolated
    for another image size, as the graphs made from it are exported."""
    from edgebuild.targets.runners import torch_runner

    outputs = ["last_hidden_state", "pooler_output"] if getattr(model, "head", None) is not None else ["last_hidden_state"]

    def forward(pixel_values: Any) -> Any:
        result = model(pixel_values=pixel_values, interpolate_pos_encoding=pixel_values.shape[-1] != image_size)
        return tuple(result[name] for name in outputs)

    return torch_runner(forward, [TensorSpec("pixel_values", (None, 3, None, None), "float32")], outputs, description,
                        model=model)


def runner(context: VerifyContext) -> Runner:
    """The built encoder: its weights on the F143 grid, in PyTorch."""
    import transformers
    from safetensors.torch import load_file
    from transformers import SiglipVisionConfig, SiglipVisionModel
    from transformers.initialization import no_init_weights

    settings = vision_settings(json.loads((context.out_dir / "config.json").read_text()))
    with no_init_weights():
        model = SiglipVisionModel(SiglipVisionConfig(**settings))
    model.load_state_dict(load_file(str(context.out_dir / MODEL_FILE)), strict=True)
    return _encoder_runner(model.eval(), settings.get("image_size", 224),
                           f"transformers {transformers.__version__} SiglipVisionModel, F143 weights (float32)")


def float_model(context: VerifyContext) -> Runner:
    """The checkpoint's float encoder: the reference of this artifact and of every graph made from it."""
    import transformers

    model, config = load_vision_model(context.checkpoint)
    return _encoder_runner(model, config.image_size,
                           f"transformers {transformers.__version__} SiglipVisionModel.forward (float32)")


def _single_images(batches: list[Any]) -> list[dict[str, Any]]:
    return [{"pixel_values": batch[index:index + 1].numpy()} for batch in batches for index in range(len(batch))]


def evaluation_inputs(context: VerifyContext[SiglipF143Params]) -> Inputs | None:
    """The held-out inputs (else the calibration inputs), one image per run."""
    params = context.params
    for label in ("held_out", "calibration"):
        inputs = getattr(params, label)
        if not inputs.is_empty():
            feeds = _single_images(load_pixel_batches(inputs, context.input_root, context.checkpoint, label))
            return Inputs(feeds, f"{len(feeds)} {label} images")
    return None


def image_feeds(context: VerifyContext, images: list[Any]) -> list[dict[str, Any]]:
    """Images through the checkpoint's own image processor at the encoder's size, one per run."""
    from edgebuild.models.hf import pixel_batches
    from edgebuild.models.siglip.model import DEFAULT_IMAGE_PROCESSOR

    size = vision_settings(json.loads((context.out_dir / "config.json").read_text())).get("image_size", 224)
    return _single_images(pixel_batches(context.checkpoint, images, [1, 3, size, size], DEFAULT_IMAGE_PROCESSOR))
