"""Building the QDQ tower: calibration inputs through the checkpoint's image processor
(what is tower-specific), then the shared static quantization (``edgebuild/ml/qdq.py``)
and a sidecar naming what was quantized."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.qdq import quantize_graph
from edgebuild.models.qwen3_5.geometry import GEOMETRY_FILE
from edgebuild.models.qwen3_5.inputs import PATCHES_INPUT, tower_inputs
from edgebuild.plugin import BuildContext, Phases

from .params import INFO_FILE, INFO_FORMAT, QdqParams


def build(context: BuildContext[QdqParams]) -> dict[str, Any]:
    params = context.params
    source = context.source
    (checkpoint,) = context.checkpoints.values()
    geometry = json.loads((source / GEOMETRY_FILE).read_text())["geometry"]
    phases = Phases()

    with phases.time("inputs"):
        samples = tower_inputs(params.calibration, context.input_root, checkpoint, geometry, "calibration")
    context.log(f"{len(samples)} calibration inputs of [{geometry['patches']}, {geometry['patch_dim']}]")
    summary = quantize_graph(source, context.out_dir, [{PATCHES_INPUT: sample} for sample in samples], params.options(),
                             phases, context.log)
    info = {"format": INFO_FORMAT, "geometry": geometry, **summary}
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return {"calibrated_tensors": summary["calibrated_tensors"], "timings": phases.seconds}
