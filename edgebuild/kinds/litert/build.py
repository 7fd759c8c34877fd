"""Converting the program to a LiteRT ``.tflite`` with ``litert_torch.convert`` (its module,
at the program's input shapes: ``convert.py``, in the environment that holds the
converter), and what the file declares (``litert.json``)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgebuild.ml.toolenv import tool_python
from edgebuild.plugin import BuildContext, ExportError, Phases

from ..torch_export.targets import program_info, program_path, random_feeds
from . import convert as convert_module
from .params import INFO_FILE, INFO_FORMAT, MODEL_FILE, LitertParams


def build(context: BuildContext) -> dict[str, Any]:
    params = context.params
    assert isinstance(params, LitertParams) and params.source is not None
    source = context.sources[params.source]
    info = program_info(source)
    (example,) = random_feeds(info, 1, 0).feeds
    out = context.out_dir / MODEL_FILE
    phases = Phases()
    with phases.time("convert"):
        _run_converter(program_path(source), [example[spec["name"]] for spec in info["inputs"]], out, context.out_dir)
    signature = _signature(out)
    (context.out_dir / INFO_FILE).write_text(json.dumps({"format": INFO_FORMAT, **signature}, indent=2, sort_keys=True) + "\n")
    context.log(f"converted to LiteRT: {len(signature['inputs'])} input(s), {len(signature['outputs'])} output(s)")
    return {"timings": phases.seconds}


def _run_converter(program: Path, example: list[Any], out: Path, scratch: Path) -> None:
    """The converter in a process of its own: this environment's Python where litert-torch
    imports here, else the LiteRT tool environment's (``edgebuild/ml/toolenv.py``)."""
    import numpy

    python = sys.executable if importlib.util.find_spec("litert_torch") is not None else str(tool_python("litert"))
    example_path = scratch / ".example.npz"
    numpy.savez(example_path, **{str(index): array for index, array in enumerate(example)})
    try:
        child = subprocess.run([python, convert_module.__file__, str(program), str(example_path), str(out)],
                               capture_output=True, text=True)
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
