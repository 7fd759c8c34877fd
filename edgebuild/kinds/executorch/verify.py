"""Judging the ``.pte``: executed in ExecuTorch's own runtime (``executorch.runtime``) on the
CPU against the program it was lowered from, at every size of its dynamic axes; a Core
ML program, which only macOS runs, is loaded (its level: loaded)."""

from __future__ import annotations

from edgebuild.core.files import RECORD_BYTES, read_json
from typing import Any

from edgebuild.plugin import NotRunnable, OutputLimits, Runner, TensorSpec, Verification, VerifyContext

from ..torch_export.judging import judge_target
from ..torch_export.targets import program_info
from .params import DEFAULT_LIMITS, INFO_FILE, PROGRAM_FILE, ExecutorchParams


def verify(context: VerifyContext) -> Verification:
    params = context.params
    assert isinstance(params, ExecutorchParams) and params.source is not None
    metrics = {"delegation": read_json(context.out_dir / INFO_FILE, RECORD_BYTES)}
    try:
        ran = runner(context)
    except NotRunnable as error:
        return judge_target(params, context.sources[params.source], None, "loaded", str(error), DEFAULT_LIMITS, metrics)
    return judge_target(params, context.sources[params.source], ran, "ran",
                        f"executed by executorch.runtime ({params.delegate})", DEFAULT_LIMITS, metrics)


def runner(context: VerifyContext) -> Runner:
    """The program in ExecuTorch's runtime; :class:`NotRunnable` for a Core ML program (macOS only)."""
    import executorch
    import torch
    from executorch.runtime import Runtime

    params = context.params
    assert isinstance(params, ExecutorchParams) and params.source is not None
    if params.delegate == "coreml":
        # Loaded, to say it is a program ExecuTorch reads; its delegate runs on macOS only.
        Runtime.get().load_program(str(context.out_dir / PROGRAM_FILE))
        raise NotRunnable("a Core ML program runs on macOS only: loaded here, not executed")
    info = program_info(context.sources[params.source])
    method = Runtime.get().load_program(str(context.out_dir / PROGRAM_FILE)).load_method("forward")
    names = [spec["name"] for spec in info["outputs"]]
    inputs = [TensorSpec(spec["name"], tuple(None if str(axis) in spec["dynamic"] else dim
                                             for axis, dim in enumerate(spec["shape"])), spec["dtype"])
              for spec in info["inputs"]]

    def run_one(feed: dict[str, Any]) -> dict[str, Any]:
        produced = method.execute(tuple(torch.from_numpy(feed[spec.name]) for spec in inputs))
        return {name: value.float().numpy() for name, value in zip(names, produced)}

    version = getattr(executorch, "__version__", "") or _version("executorch")
    return Runner(f"ExecuTorch {version} runtime ({params.delegate})", inputs, names, run_one)


def float_limits(params: ExecutorchParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS)


def _version(package: str) -> str:
    from importlib import metadata

    return metadata.version(package)
