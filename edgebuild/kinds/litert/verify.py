"""Judging the ``.tflite``: executed by LiteRT's own interpreter (``ai_edge_litert``) on the
CPU against the program it was converted from."""

from __future__ import annotations

from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.errors import NotRunnable
from edgebuild.plugin import OutputLimits, Runner, TensorSpec, Verification, VerifyContext
from edgebuild.targets.judging import judge_target
from edgebuild.targets.program import output_names, program_info

from .params import DEFAULT_LIMITS, INFO_FILE, MODEL_FILE, LitertParams
from .signature import in_program_order


def verify(context: VerifyContext[LitertParams]) -> Verification:
    metrics = {"signature": read_json(context.out_dir / INFO_FILE, RECORD_BYTES)}
    return judge_target(context, runner(context), "ran",
                        "executed by the LiteRT interpreter", DEFAULT_LIMITS, metrics)


def runner(context: VerifyContext[LitertParams], threads: int | None = None) -> Runner:
    """The model in LiteRT's interpreter (on ``threads`` threads; ``None``: its default);
    its inputs and outputs in the program's order."""
    from importlib import metadata

    from ai_edge_litert.interpreter import Interpreter

    info = program_info(context.source)
    interpreter = Interpreter(model_path=str(context.out_dir / MODEL_FILE), num_threads=threads)
    interpreter.allocate_tensors()
    inputs = in_program_order(interpreter.get_input_details())
    outputs = in_program_order(interpreter.get_output_details())
    names = output_names(info)
    specs = [TensorSpec(spec["name"], tuple(spec["shape"]), spec["dtype"]) for spec in info["inputs"]]

    def run_one(feed: dict[str, Any]) -> dict[str, Any]:
        for spec, detail in zip(specs, inputs):
            interpreter.set_tensor(detail["index"], as_declared(feed[spec.name], detail["dtype"], spec.name))
        interpreter.invoke()
        return {name: interpreter.get_tensor(detail["index"]).copy() for name, detail in zip(names, outputs)}

    return Runner(f"LiteRT {metadata.version('ai-edge-litert')} interpreter", specs, names, run_one,
                  threads=threads, on_threads=lambda count: runner(context, count))


def as_declared(value: Any, declared: Any, name: str) -> Any:
    """``value`` as the dtype the converted model declares for input ``name``: the converter
    turns int64 ids and masks into int32 (``litert.json`` records what it declared). Cast
    only where every value survives; :class:`NotRunnable` naming the input otherwise."""
    import numpy

    wanted = numpy.dtype(declared)
    if value.dtype == wanted:
        return value
    if numpy.issubdtype(value.dtype, numpy.integer) and numpy.issubdtype(wanted, numpy.integer):
        bounds = numpy.iinfo(wanted)
        if value.size and (int(value.min()) < bounds.min or int(value.max()) > bounds.max):
            raise NotRunnable(f"input {name}: values from {int(value.min())} to {int(value.max())} do not fit the "
                              f"{wanted} the converted model declares")
        return value.astype(wanted)
    if numpy.issubdtype(value.dtype, numpy.floating) and numpy.issubdtype(wanted, numpy.floating):
        return value.astype(wanted)
    raise NotRunnable(f"input {name}: the converted model declares {wanted}, and the input is {value.dtype}")


def float_limits(params: LitertParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS)
