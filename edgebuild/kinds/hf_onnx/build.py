"""Export: the model loaded strictly, its outputs checked, the graph exported by torch's
dynamo exporter at the manifest's shapes (dynamic axes between their sizes), ``allowzero``
cleared."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.plugin import BuildContext, ExportError, Phases

from edgebuild.models.hf import check_outputs, dynamic_shapes, load_model, outputs_module, random_inputs

from .params import INFO_FILE, INFO_FORMAT, MODEL_FILE, HfOnnxParams


def build(context: BuildContext[HfOnnxParams]) -> dict[str, Any]:
    import torch

    from edgebuild.ml.onnx_tools import export_onnx, sanitize_allowzero

    params = context.params
    phases = Phases()
    with phases.time("load"):
        model = load_model(params, context.checkpoint)
    (example,) = random_inputs(params, model.config, 1, seed=0)
    with phases.time("check"):
        output_shapes = check_outputs(model, params, tuple(tensor.float() if tensor.is_floating_point() else tensor
                                                           for tensor in example))
    if params.dtype != "float32":
        model = model.to(getattr(torch, params.dtype))
    module = outputs_module(model, params)
    path = context.out_dir / MODEL_FILE
    with phases.time("export"):
        try:
            export_onnx(module, example, path, list(params.inputs), list(params.outputs), params.opset,
                        dynamic_shapes(params.inputs))
        except ExportError:
            raise
        except Exception as error:  # the exporter raises anything, several lines of it
            reason = " ".join(str(error).split())[:400]
            raise ExportError(f"{params.model_class}: torch's ONNX exporter cannot take it: {type(error).__name__}: {reason}") from None
    with phases.time("sanitize"):
        cleared = sanitize_allowzero(path)
    context.log(f"exported {params.model_class} at opset {params.opset} ({params.dtype}); "
                f"cleared allowzero on {cleared} Reshape nodes")
    info = {
        "format": INFO_FORMAT,
        "model_class": params.model_class,
        "dtype": params.dtype,
        "opset": params.opset,
        # Lists, in the graph's order (the file's keys are sorted).
        "inputs": [{"name": name, "shape": spec.shape, "dtype": params.input_dtype(name)}
                   | ({"dynamic": {str(axis): bounds for axis, bounds in spec.dynamic.items()}} if spec.dynamic else {})
                   for name, spec in params.inputs.items()],
        "outputs": [{"name": name, "shape": output_shapes[name], "dtype": params.dtype} for name in params.outputs],
        "allowzero_cleared": cleared,
    }
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info | {"timings": phases.seconds}
