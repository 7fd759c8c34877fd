"""Building ``siglip_f143``: load, calibrate and reconstruct, measure, save.

Where the outputs depart from the seed's script, and why: ``preprocessor_config.json``
is written (the seed drops it) so the directory works as a model directory; the
state dict has SiglipVisionModel's own keys (no ``vision_model.`` prefix) so it
loads strictly into it; a negative zero weight is stored as +0.0 (equal in
value; float8 has no -0, and the packed form must round-trip bit for bit).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from typing import Any

from edgebuild.ml.compare import compare_outputs, worst_case
from edgebuild.ml.mapped_safetensors import MappedSafetensors
from edgebuild.models.siglip.model import PREPROCESSOR_FILE, encoder_outputs, load_pixel_batches, load_vision_model, outputs_digest
from edgebuild.plugin import BuildContext, Phases
from .calibration import calibrate, encoder_linears, is_linear_weight
from .packed import PACKED_FORMAT, pack_state, save_safetensors
from .params import MODEL_FILE, PACKED_FILE, REPORT_FILE, SiglipF143Params


def build(context: BuildContext[SiglipF143Params]) -> dict[str, Any]:
    import torch

    params = context.params
    checkpoint = context.checkpoint
    preprocessor = checkpoint.file(PREPROCESSOR_FILE)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if params.device == "auto" else params.device)
    phases = Phases()

    with phases.time("load"):
        model, config = load_vision_model(checkpoint, writable=True, replaced=is_linear_weight)
        model.to(device)
        layer_count = config.num_hidden_layers if params.layers == "all" else params.layers
        batches = load_pixel_batches(params.calibration, context.input_root, checkpoint, "calibration")
        held_out = load_pixel_batches(params.held_out, context.input_root, checkpoint, "held_out")
        modules = encoder_linears(model, layer_count)
        out = context.out_dir
        metadata = {"format": "pt", "ipu_f143_reconstruction": params.algorithm, "edgebuild_fingerprint": context.fingerprint}
        # model.safetensors laid out now: each reconstructed weight goes straight into
        # the file's pages instead of into memory of its own and then the file.
        mapped = MappedSafetensors.create(out / MODEL_FILE, model.state_dict(), metadata, params.sorted_metadata)
    context.log(f"{len(modules)} linears in {layer_count} layers; {sum(len(batch) for batch in batches)} calibration images")

    destination = (lambda name: mapped.view(f"{name}.weight")) if mapped is not None else None
    calibration = calibrate(model, modules, batches, held_out, params, layer_count, device, phases, context.log,
                            destination)

    with phases.time("final_pass"):
        quantized_outputs = encoder_outputs(model, batches, device)
        held_out_outputs = encoder_outputs(model, held_out, device)
        metrics = [compare_outputs(reference, output) for reference, output in zip(calibration.references, quantized_outputs)]
        held_out_metrics = [
            compare_outputs(reference, output) for reference, output in zip(calibration.held_out_references, held_out_outputs)
        ]

    with phases.time("save"):
        state = {name: value.detach().cpu() for name, value in model.state_dict().items()}
        quantized_names = [f"{name}.weight" for name in modules]
        shutil.copy2(checkpoint.config_path, out / "config.json")
        shutil.copy2(preprocessor, out / PREPROCESSOR_FILE)
        if mapped is not None:
            mapped.write(state)
        else:
            save_safetensors(state, out / MODEL_FILE, metadata, params.sorted_metadata)
        packed_metadata = {"format": "pt", "format_f143": PACKED_FORMAT, "block_size": str(params.block_size),
                           "edgebuild_fingerprint": context.fingerprint}
        save_safetensors(pack_state(state, quantized_names, params.block_size), out / PACKED_FILE, packed_metadata, True)

    report = {
        "algorithm": f"block-diagonal-f143-{params.algorithm}",
        "options": params.build_parameters(),
        "layers": layer_count,
        "quantized_linears": quantized_names,
        "equalization": {name: asdict(choice) for name, choice in calibration.equalization.items()},
        "equalization_metrics": calibration.equalization_metrics,
        "metrics": metrics,
        "held_out_metrics": held_out_metrics,
        "objectives": {name: result.to_json() for name, result in calibration.linears.items()},
        "objective_ratio": calibration.objective_ratio(),
        "saturated_weights": {name: result.saturated for name, result in calibration.linears.items()},
        "calibration_outputs_digest": outputs_digest(quantized_outputs),
        "held_out_outputs_digest": outputs_digest(held_out_outputs),
        "forward_passes": calibration.forward_passes,
    }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
    context.log(
        f"objective ratio {report['objective_ratio']:.4f}; cosine {worst_case(metrics)['cosine']:.6f}; "
        f"{calibration.forward_passes} calibration passes; reconstruction {phases.seconds.get('reconstruction_s', 0.0):.2f} s"
    )
    return {"timings": phases.seconds, "forward_passes": calibration.forward_passes,
            "objective_ratio": report["objective_ratio"]}
