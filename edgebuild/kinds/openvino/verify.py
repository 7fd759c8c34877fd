"""Judging the IR: compiled by OpenVINO's CPU plugin with the float32 precision hint (its
default is bf16 on CPUs that have it) and run against the program it was converted from,
at every size of its dynamic axes; what the plugin says it takes (``query_model``)."""

from __future__ import annotations

from edgebuild.core.files import RECORD_BYTES, read_json
from typing import Any

from edgebuild.plugin import OutputLimits, Runner, TensorSpec, Verification, VerifyContext

from ..torch_export.judging import judge_target
from ..torch_export.targets import program_info
from .params import DEFAULT_LIMITS, INFO_FILE, MODEL_FILE, OpenvinoParams

PRECISION = {"INFERENCE_PRECISION_HINT": "f32"}


def verify(context: VerifyContext) -> Verification:
    import openvino

    params = context.params
    assert isinstance(params, OpenvinoParams) and params.source is not None
    core = openvino.Core()
    model = core.read_model(str(context.out_dir / MODEL_FILE))
    taken = core.query_model(model, params.device)
    metrics = {"openvino": read_json(context.out_dir / INFO_FILE, RECORD_BYTES),
               "query_model": {"device": params.device, "ops": len(model.get_ops()), "taken": len(taken)}}
    return judge_target(params, context.sources[params.source], runner(context), "ran",
                        f"executed by OpenVINO's {params.device} plugin (f32 precision hint)",
                        DEFAULT_LIMITS[params.quantize], metrics)


def runner(context: VerifyContext) -> Runner:
    """The IR compiled for the CPU plugin in float32."""
    import openvino

    params = context.params
    assert isinstance(params, OpenvinoParams) and params.source is not None
    info = program_info(context.sources[params.source])
    compiled = openvino.Core().compile_model(str(context.out_dir / MODEL_FILE), params.device, PRECISION)
    names = [spec["name"] for spec in info["outputs"]]
    specs = [TensorSpec(spec["name"], tuple(None if str(axis) in spec["dynamic"] else dim
                                            for axis, dim in enumerate(spec["shape"])), spec["dtype"])
             for spec in info["inputs"]]

    def run_one(feed: dict[str, Any]) -> dict[str, Any]:
        produced = compiled([feed[spec.name] for spec in specs])
        return {name: produced[port] for name, port in zip(names, compiled.outputs)}

    return Runner(f"OpenVINO {openvino.__version__} {params.device} plugin (f32)", specs, names, run_one)


def float_limits(params: OpenvinoParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS[params.quantize])
