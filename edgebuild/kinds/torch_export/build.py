"""Exporting the model: its family's module, loaded strictly, traced by ``torch.export`` at
the description's shapes (dynamic axes between their sizes), saved as ``program.pt2`` the
same bytes every time; ``export.json`` says what goes in and comes out."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.models.families import family_of
from edgebuild.models.hf import dynamic_shapes
from edgebuild.plugin import BuildContext, ExportError, Phases
from edgebuild.targets.formats import PROGRAM_FILE, PROGRAM_INFO_FILE, PROGRAM_INFO_FORMAT
from edgebuild.targets.program import save_program

from .params import TorchExportParams


def build(context: BuildContext[TorchExportParams]) -> dict[str, Any]:
    import torch

    params = context.params
    family = family_of(params)
    checkpoint = context.checkpoint
    phases = Phases()
    with phases.time("load"):
        module = family.module(params, checkpoint)
    inputs = family.inputs(params, checkpoint)
    outputs = family.outputs(params)
    (example,) = family.examples(params, checkpoint, {spec.name: list(spec.shape) for spec in inputs}, 1, seed=0)
    with phases.time("check"):
        try:
            with torch.no_grad():
                produced = module(*(tensor.float() if tensor.is_floating_point() else tensor for tensor in example))
        except KeyError as error:
            raise ExportError(f"outputs: {params.model_class} returns no {error.args[0]!r}") from None
        except (TypeError, ValueError, RuntimeError) as error:
            reason = " ".join(str(error).split())[:400]
            raise ExportError(f"{params.model_class}.forward refused the inputs {[spec.name for spec in inputs]}: "
                              f"{reason}") from None
    if params.dtype != "float32":
        dtype = getattr(torch, params.dtype)
        module = module.to(dtype)
        example = tuple(tensor.to(dtype) if tensor.is_floating_point() else tensor for tensor in example)
    with phases.time("export"):
        try:
            program = torch.export.export(module, example, dynamic_shapes=dynamic_shapes(params.inputs))
        except Exception as error:  # the exporter raises anything, several lines of it
            reason = " ".join(str(error).split())[:400]
            raise ExportError(f"{params.model_class}: torch.export cannot take it: {type(error).__name__}: {reason}") from None
    with phases.time("save"):
        save_program(program, context.out_dir / PROGRAM_FILE)
    context.log(f"exported {params.model_class}{f'.{params.submodule}' if params.submodule else ''} with torch.export "
                f"({family.name}, {params.dtype}): {len(program.graph.nodes)} nodes")
    info = {
        "format": PROGRAM_INFO_FORMAT,
        "family": family.name,
        "model_class": params.model_class,
        "submodule": params.submodule,
        "dtype": params.dtype,
        "inputs": [{"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype,
                    "dynamic": {str(axis): bounds for axis, bounds in (params.inputs[spec.name].dynamic.items()
                                                                      if params.inputs else ())}}
                   for spec in inputs],
        "outputs": [{"name": name, "shape": list(value.shape), "dtype": params.dtype}
                    for name, value in zip(outputs, produced)],
    }
    (context.out_dir / PROGRAM_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return {"timings": phases.seconds}
