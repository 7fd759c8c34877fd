"""Judging the IR: compiled by OpenVINO's CPU plugin with the float32 precision hint (its
default is bf16 on CPUs that have it) and run against the program it was converted from,
at every size of its dynamic axes; what the plugin says it takes (``query_model``)."""

from __future__ import annotations

from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.plugin import OutputLimits, Runner, Verification, VerifyContext
from edgebuild.targets.judging import judge_target
from edgebuild.targets.program import input_specs, output_names, program_info

from .params import DEFAULT_LIMITS, INFO_FILE, MODEL_FILE, OpenvinoParams

PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}


def verify(context: VerifyContext[OpenvinoParams]) -> Verification:
    import openvino

    params = context.params
    core = openvino.Core()
    model = core.read_model(str(context.out_dir / MODEL_FILE))
    taken = core.query_model(model, params.device)
    metrics = {"openvino": read_json(context.out_dir / INFO_FILE, RECORD_BYTES),
               "query_model": {"device": params.device, "ops": len(model.get_ops()), "taken": len(taken)}}
    return judge_target(context, runner(context), "ran",
                        f"executed by OpenVINO's {params.device} plugin (f32 precision hint)",
                        DEFAULT_LIMITS[params.quantize], metrics)


def runner(context: VerifyContext[OpenvinoParams], threads: int | None = None) -> Runner:
    """The IR compiled for the CPU plugin in float32 (on ``threads`` inference threads;
    ``None``: the plugin's choice)."""
    import openvino

    params = context.params
    info = program_info(context.source)
    config = PRECISION | ({"INFERENCE_NUM_THREADS": threads} if threads is not None else {})
    compiled = openvino.Core().compile_model(str(context.out_dir / MODEL_FILE), params.device, config)
    names = output_names(info)
    specs = input_specs(info)

    def run_one(feed: dict[str, Any]) -> dict[str, Any]:
        produced = compiled([feed[spec.name] for spec in specs])
        return {name: produced[port] for name, port in zip(names, compiled.outputs)}

    return Runner(f"OpenVINO {openvino.__version__} {params.device} plugin (f32)", specs, names, run_one,
                  threads=threads, on_threads=lambda count: runner(context, count))


def float_limits(params: OpenvinoParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS[params.quantize])
