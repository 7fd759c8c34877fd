"""Converting the program to a LiteRT ``.tflite`` with ``litert_torch.convert`` (its module,
at the program's input shapes: ``convert.py``, in the environment that holds the
converter), and what the file declares (``litert.json``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgebuild.plugin import BuildContext, ExportError, Phases
from edgebuild.targets import folding
from edgebuild.targets.program import example_arrays, program_info, program_path
from edgebuild.targets.toolenv import tool_python

from . import convert as convert_module
from .environment import LITERT_CONVERTER, converter_here
from .params import INFO_FILE, INFO_FORMAT, MODEL_FILE, LitertParams
from .signature import in_program_order


def build(context: BuildContext[LitertParams]) -> dict[str, Any]:
    source = context.source
    out = context.out_dir / MODEL_FILE
    phases = Phases()
    with phases.time("convert"):
        _run_converter(program_path(source), example_arrays(program_info(source)), out, context.out_dir)
    signature = _signature(out)
    (context.out_dir / INFO_FILE).write_text(json.dumps({"format": INFO_FORMAT, **signature}, indent=2, sort_keys=True) + "\n")
    context.log(f"converted to LiteRT: {len(signature['inputs'])} input(s), {len(signature['outputs'])} output(s)")
    return {"timings": phases.seconds}


def _run_converter(program: Path, example: list[Any], out: Path, scratch: Path) -> None:
    """The converter in a process of its own: this environment's Python where litert-torch
    imports here, else its own environment's (``environment.py``)."""
    import numpy

    python = sys.executable if converter_here() else str(tool_python(LITERT_CONVERTER))
    example_path = scratch / ".example.npz"
    numpy.savez(example_path, **{str(index): array for index, array in enumerate(example)})
    try:
        child = subprocess.run([python, convert_module.__file__, str(program), str(example_path), str(out),
                                folding.__file__], capture_output=True, text=True)
    finally:
        example_path.unlink(missing_ok=True)
    lines = child.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        result = {}
    if child.returncode != 0 or not result.get("ok"):
        detail = result.get("error") or (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
        raise ExportError(f"litert_torch cannot convert {program.parent.name}'s program: {detail}")


def _signature(path: Any) -> dict[str, Any]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))

    def described(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"name": item["name"], "shape": [int(dim) for dim in item["shape"]], "dtype": item["dtype"].__name__}
                for item in details]

    return {"inputs": described(interpreter.get_input_details()), "outputs": described(interpreter.get_output_details())}


def program_signature(path: Path, info: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What the ``.tflite`` takes and gives (``consumer.json``'s ``programs``), as the
    interpreter declares it (ids and masks the program takes as int64 may be int32 here),
    in the program's order and named as the program names them; ``tensor``: the name the
    interpreter knows it by (``get_input_details()``)."""
    import numpy
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(path))
    declared = {"inputs": in_program_order(interpreter.get_input_details()),
                "outputs": in_program_order(interpreter.get_output_details())}
    described: dict[str, list[dict[str, Any]]] = {}
    for side, details in declared.items():
        specs = info[side]
        if len(specs) != len(details):
            raise ExportError(f"{path.name}: it has {len(details)} {side}, and the program it was converted from "
                              f"{len(specs)}")
        described[side] = [{"name": spec["name"], "dtype": numpy.dtype(detail["dtype"]).name,
                            "shape": [int(dim) for dim in detail["shape"]], "tensor": detail["name"]}
                           for spec, detail in zip(specs, details)]
    return described
