"""Building the QDQ tower: calibration inputs through the checkpoint's image processor,
onnxruntime's QNN QDQ configuration, chunked calibration, quantization, and a sidecar
naming what was quantized."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edgebuild.plugin import BuildContext, Phases
from ..qwen3_5_tower.params import GEOMETRY_FILE as SOURCE_GEOMETRY_FILE
from ..qwen3_5_tower.params import MODEL_FILE as SOURCE_MODEL_FILE
from ..qwen3_5_tower.params import WEIGHTS_FILE as SOURCE_WEIGHTS_FILE
from .graph import qdq_summary
from .inputs import tower_inputs
from .params import INFO_FILE, INFO_FORMAT, MODEL_FILE, PATCHES_INPUT, WEIGHTS_FILE, QdqParams
from .qdq import CALIBRATION_CHUNK, calibrate, qnn_config, quantize_with_ranges


def build(context: BuildContext) -> dict[str, Any]:
    params = context.params
    assert isinstance(params, QdqParams)
    source = context.sources[params.source]
    (checkpoint,) = context.checkpoints.values()
    geometry = json.loads((source / SOURCE_GEOMETRY_FILE).read_text())["geometry"]
    phases = Phases()

    with phases.time("inputs"):
        samples = tower_inputs(params.calibration, context.input_root, checkpoint, geometry, "calibration")
    sample_count = len(samples)
    context.log(f"{sample_count} calibration inputs of [{geometry['patches']}, {geometry['patch_dim']}]")

    # onnxruntime writes a shape-inferred copy beside the model it is given: a copy of
    # the source graph in a scratch directory keeps it out of the source's build
    # directory (which another artifact may be reading, or quantizing, at the same time).
    with tempfile.TemporaryDirectory(prefix="qdq-", dir=context.out_dir.parent) as scratch_name:
        scratch = Path(scratch_name)
        float_model = scratch / SOURCE_MODEL_FILE
        with phases.time("copy"):
            shutil.copyfile(source / SOURCE_MODEL_FILE, float_model)
            shutil.copyfile(source / SOURCE_WEIGHTS_FILE, scratch / SOURCE_WEIGHTS_FILE)
        config = qnn_config(float_model, samples, PATCHES_INPUT, params.activation_type, params.weight_type,
                            params.per_channel, params.calibration_method)
        with phases.time("calibrate"):
            ranges = calibrate(float_model, config, samples, PATCHES_INPUT, scratch)
        context.log(f"calibrated {len(ranges.data)} tensors ({params.calibration_method})")
        del samples
        with phases.time("quantize"):
            quantize_with_ranges(float_model, context.out_dir / MODEL_FILE, config, ranges, scratch)

    # onnxruntime creates the weights file owner-only; an artifact is read by others.
    (context.out_dir / WEIGHTS_FILE).chmod(0o644)
    with phases.time("summarize"):
        summary = qdq_summary(context.out_dir / MODEL_FILE, set(config.op_types_to_quantize))
    info = {
        "format": INFO_FORMAT,
        "activation_type": params.activation_type,
        "weight_type": params.weight_type,
        "per_channel": params.per_channel,
        "calibration_method": params.calibration_method,
        "calibration_chunk": CALIBRATION_CHUNK,
        "calibration_inputs": sample_count,
        "geometry": geometry,
        "op_types_to_quantize": sorted(config.op_types_to_quantize),
        **summary,
    }
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    context.log(
        f"quantized: {summary['quantized_weights']['count']} weights, "
        f"{summary['qdq_nodes']['QuantizeLinear']} QuantizeLinear, {summary['qdq_nodes']['DequantizeLinear']} DequantizeLinear; "
        f"{len(summary['left_float'])} float tensor(s) read by computing nodes (see {INFO_FILE})"
    )
    return {"calibrated_tensors": len(ranges.data), "timings": phases.seconds}
