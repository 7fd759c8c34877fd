"""Exporting the model: its family's module, loaded strictly, traced by ``torch.export`` at
the description's shapes (dynamic axes between their sizes), saved as ``program.pt2`` the
same bytes every time; ``export.json`` says what goes in and comes out."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.ml.programs import save_program
from edgebuild.plugin import BuildContext, ExportError, Phases

from .families import family_of
from .params import INFO_FILE, INFO_FORMAT, PROGRAM_FILE, TorchExportParams


def build(context: BuildContext) -> dict[str, Any]:
    import torch

    params = context.params
    assert isinstance(params, TorchExportParams)
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
            program = torch.export.export(module, example, dynamic_shapes=_dynamic_shapes(params))
        except Exception as error:  # the exporter raises anything, several lines of it
            reason = " ".join(str(error).split())[:400]
            raise ExportError(f"{params.model_class}: torch.export cannot take it: {type(error).__name__}: {reason}") from None
    with phases.time("save"):
        save_program(program, context.out_dir / PROGRAM_FILE)
    context.log(f"exported {params.model_class}{f'.{params.submodule}' if params.submodule else ''} with torch.export "
                f"({family.name}, {params.dtype}): {len(program.graph.nodes)} nodes")
    info = {
        "format": INFO_FORMAT,
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
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return {"timings": phases.seconds}


def _dynamic_shapes(params: TorchExportParams) -> tuple[Any, ...] | None:
    """``torch.export``'s dynamic shapes for the module's positional inputs: a ``Dim``
    per dynamic axis, between its sizes; ``None`` when every shape is fixed."""
    from torch.export import Dim

    if not params.dynamic:
        return None
    assert params.inputs is not None
    specs = []
    for name, spec in params.inputs.items():
        specs.append({axis: Dim(f"{name}_{axis}", min=low, max=high) for axis, (low, high) in spec.dynamic.items()}
                     or None)
    # One argument, *tensors: its spec is the tuple of each tensor's.
    return (tuple(specs),)
