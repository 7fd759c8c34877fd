"""Converting the program to OpenVINO IR (``ov.convert_model`` takes a ``torch.export``
program), its inputs and outputs named and shaped as the program's (the converter names
them ``tensors_<i>`` and leaves every input axis dynamic), optionally quantized to INT8 by
NNCF on the calibration inputs, saved as ``model.xml`` + ``model.bin`` with its float
weights as they are (no fp16 compression)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgebuild.models.graph_inputs import graph_feeds
from edgebuild.plugin import BuildContext, ExportError, Phases
from edgebuild.targets.program import load_program, program_info, program_path, traced_modules

from .params import INFO_FILE, INFO_FORMAT, MODEL_FILE, OpenvinoParams


def build(context: BuildContext[OpenvinoParams]) -> dict[str, Any]:
    import openvino

    params = context.params
    source = context.source
    info = program_info(source)
    phases = Phases()
    with phases.time("convert"):
        try:
            from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

            # The decoder convert_model makes of a program, made here: it decomposes the
            # program first (layer norms, not linears), renaming nodes, and OpenVINO names
            # each op after the decomposed node ("<node>/<aten op>/<op>"); its graph gives
            # the module of every op, for the coverage certificate.
            decoder = TorchFXPythonDecoder.from_exported_program(load_program(program_path(source)))
            modules = traced_modules(decoder.pt_module)
            model = openvino.convert_model(decoder)
            named_and_shaped(model, info)
        except Exception as error:  # OpenVINO's frontend raises its own kinds
            reason = " ".join(str(error).split())[:400]
            raise ExportError(f"OpenVINO cannot convert {params.source}'s program: {type(error).__name__}: {reason}") from None
    calibrated = 0
    if params.quantize == "int8":
        import nncf

        (checkpoint,) = context.checkpoints.values()
        signature = {spec["name"]: spec for spec in info["inputs"]}
        with phases.time("inputs"):
            feeds = graph_feeds(params.calibration, context.input_root, checkpoint, signature, "calibration")
        with phases.time("quantize"):
            names = [spec["name"] for spec in info["inputs"]]
            dataset = nncf.Dataset([tuple(feed[name] for name in names) for feed in feeds])
            model = nncf.quantize(model, dataset, subset_size=len(feeds))
        calibrated = len(feeds)
    with phases.time("save"):
        openvino.save_model(model, str(context.out_dir / MODEL_FILE), compress_to_fp16=False)
    summary = {
        "format": INFO_FORMAT,
        "quantize": params.quantize,
        "calibration_samples": calibrated,
        "inputs": [item.get_any_name() for item in model.inputs],
        "outputs": [item.get_any_name() for item in model.outputs],
        "ops": len(model.get_ops()),
        "modules": modules,
    }
    (context.out_dir / INFO_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    context.log(f"converted to OpenVINO IR ({params.quantize}): {summary['ops']} ops"
                + (f", INT8 calibrated on {calibrated} inputs" if calibrated else ""))
    return {"timings": phases.seconds}


def named_and_shaped(model: Any, info: dict[str, Any]) -> None:
    """Name ``model``'s inputs and outputs as the program does (``export.json``: what a
    tokenizer or an image processor makes, and the model's outputs), where the converter
    calls them ``tensors_0`` or ``linear_13:0``; and fix the input axes the program fixes,
    which the converter leaves open (a dynamic axis stays open and unbounded: the IR takes
    what it took before)."""
    import openvino

    for side, ports in (("inputs", model.inputs), ("outputs", model.outputs)):
        specs = info[side]
        if len(specs) != len(ports):
            raise ExportError(f"OpenVINO converted the program to {len(ports)} {side}, and it has {len(specs)}")
        for port, spec in zip(ports, specs):
            port.get_tensor().set_names({spec["name"]})
    shapes = {}
    for port, spec in zip(model.inputs, info["inputs"]):
        dynamic = spec.get("dynamic", {})
        shapes[port] = openvino.PartialShape([openvino.Dimension() if str(axis) in dynamic else openvino.Dimension(size)
                                              for axis, size in enumerate(spec["shape"])])
    model.reshape(shapes)


def program_signature(path: Path) -> dict[str, list[dict[str, Any]]]:
    """What the IR takes and gives (``consumer.json``'s ``programs``), as OpenVINO reads it:
    names, element types as NumPy dtype names, each dimension a number or ``None`` where it
    is dynamic."""
    import openvino

    model = openvino.Core().read_model(str(path))

    def described(ports: Any) -> list[dict[str, Any]]:
        return [{"name": port.get_any_name(), "dtype": port.get_element_type().to_dtype().name,
                 "shape": [dim.get_length() if dim.is_static else None for dim in port.get_partial_shape()]}
                for port in ports]

    return {"inputs": described(model.inputs), "outputs": described(model.outputs)}
