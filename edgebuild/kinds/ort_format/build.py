"""Converting the source's ONNX graph to the ORT format with onnxruntime's own tool
(``onnxruntime.tools.convert_onnx_models_to_ort``): ``model.ort`` (its head laid out again
in one fixed way: ``canonical.py``), and the operators a reduced onnxruntime build must
register for it (``required_operators.config``)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_text
from edgebuild.plugin import BuildContext, ExportError, Phases

from .canonical import UnknownLayout, write_canonical
from .params import INFO_FILE, INFO_FORMAT, MODEL_FILE, OPERATORS_FILE, SOURCE_MODEL, OrtFormatParams


def build(context: BuildContext[OrtFormatParams]) -> dict[str, Any]:
    import onnxruntime
    from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

    params = context.params
    source = context.source
    style = OptimizationStyle.Fixed if params.optimization == "fixed" else OptimizationStyle.Runtime
    phases = Phases()
    with tempfile.TemporaryDirectory(dir=context.out_dir, prefix=".convert-") as scratch:
        work = Path(scratch)
        # The graph and its data file side by side, under the name the graph gives its data.
        for path in source.iterdir():
            if path.name == SOURCE_MODEL or path.name.startswith(f"{SOURCE_MODEL}."):
                shutil.copyfile(path, work / path.name)
        with phases.time("convert"):
            try:
                # The tool prints each step (with this scratch directory's paths), and its config
                # writer logs at INFO through a stderr handler it installs on import: the log says
                # it in one line.
                with contextlib.redirect_stdout(io.StringIO()), _library_info_silenced():
                    convert_onnx_models_to_ort(work / SOURCE_MODEL, output_dir=work / "out", optimization_styles=[style])
            except Exception as error:  # the tool raises onnxruntime's own kinds
                reason = " ".join(str(error).split())[:400]
                raise ExportError(f"onnxruntime cannot convert {params.source}'s graph to the ORT format: "
                                  f"{type(error).__name__}: {reason}") from None
        produced = sorted((work / "out").rglob("*.ort"))
        operators = sorted((work / "out").rglob("*.config"))
        if len(produced) != 1 or len(operators) != 1:
            found = ", ".join(path.name for path in (work / "out").rglob("*")) or "nothing"
            raise ExportError(f"onnxruntime's converter wrote {found}; expected one .ort model and its operators' config")
        # The converter's bytes differ from process to process (the order of a hash map's
        # entries in the file's head, see canonical.py): the same graph is written again
        # in one fixed layout, so that a build's digest is the same wherever it runs.
        try:
            write_canonical(produced[0], context.out_dir / MODEL_FILE)
        except UnknownLayout as error:
            raise ExportError(f"onnxruntime {onnxruntime.__version__} wrote an ORT file edgebuild cannot lay out "
                              f"reproducibly: {error}; expected the head onnxruntime 1.32 writes (install that "
                              "version for this kind)") from None
        # The tool heads the file with the paths of the models it read ("# - PATH"): in this
        # build's scratch directory, names that differ on every build. The file names each
        # model by its file name instead.
        lines = read_text(operators[0], RECORD_BYTES).splitlines(keepends=True)
        (context.out_dir / OPERATORS_FILE).write_text("".join(
            f"# - {Path(line[4:].strip()).name}\n" if line.startswith("# - ") else line for line in lines))
    info = {"format": INFO_FORMAT, "optimization": params.optimization, "onnxruntime": onnxruntime.__version__}
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    context.log(f"converted to the ORT format ({params.optimization} optimizations)")
    return {"timings": phases.seconds}


@contextlib.contextmanager
def _library_info_silenced():
    """Records below WARNING dropped, from every logger, while the converter runs."""
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        yield
    finally:
        logging.disable(previous)


# onnxruntime's element type names (``NodeArg.type``: ``tensor(float)``) by their NumPy names.
_NUMPY_NAMES = {"float": "float32", "double": "float64", "float16": "float16", "bfloat16": "bfloat16",
                "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
                "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "bool": "bool", "string": "str"}


def program_signature(path: Path) -> dict[str, list[dict[str, Any]]]:
    """What the ORT file takes and gives (``consumer.json``'s ``programs``), as onnxruntime
    reads it: names, element types as NumPy dtype names, each dimension a number, the name
    of a symbolic one, or ``None``."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def described(values: Any) -> list[dict[str, Any]]:
        found = []
        for value in values:
            element = value.type.removeprefix("tensor(").removesuffix(")")
            found.append({"name": value.name, "dtype": _NUMPY_NAMES.get(element, element),
                          "shape": [dim if isinstance(dim, (int, str)) else None for dim in value.shape]})
        return found

    return {"inputs": described(session.get_inputs()), "outputs": described(session.get_outputs())}
