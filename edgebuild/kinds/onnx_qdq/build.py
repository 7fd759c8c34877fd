"""Building the QDQ graph: the calibration inputs at the source graph's fixed shapes,
then onnxruntime's static quantization in bounded memory (``edgebuild/ml/qdq.py``)."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.qdq import quantize_graph
from edgebuild.models.graph_inputs import graph_feeds
from edgebuild.plugin import BuildContext, Phases

from .params import INFO_FILE, INFO_FORMAT, OnnxQdqParams, source_signature


def build(context: BuildContext[OnnxQdqParams]) -> dict[str, Any]:
    params = context.params
    source = context.source
    (checkpoint,) = context.checkpoints.values()
    signature = source_signature(source)
    phases = Phases()
    with phases.time("inputs"):
        feeds = graph_feeds(params.calibration, context.input_root, checkpoint, signature, "calibration")
    summary = quantize_graph(source, context.out_dir, feeds, params.options(), phases, context.log)
    info = {"format": INFO_FORMAT, "inputs": signature, **summary}
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return {"calibrated_tensors": summary["calibrated_tensors"], "timings": phases.seconds}
