"""Judging the ``.pte``: executed in ExecuTorch's own runtime (``executorch.runtime``) on the
CPU against the program it was lowered from, at every size of its dynamic axes; a Core
ML program, which only macOS runs, is loaded (its level: loaded)."""

from __future__ import annotations

from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.plugin import NotRunnable, OutputLimits, Runner, Verification, VerifyContext
from edgebuild.targets.coverage import package_version
from edgebuild.targets.judging import judge_target
from edgebuild.targets.program import input_specs, output_names, program_info

from .params import DEFAULT_LIMITS, INFO_FILE, PROGRAM_FILE, ExecutorchParams


def verify(context: VerifyContext[ExecutorchParams]) -> Verification:
    params = context.params
    metrics = {"delegation": read_json(context.out_dir / INFO_FILE, RECORD_BYTES)}
    try:
        ran = runner(context)
    except NotRunnable as error:
        return judge_target(context, None, "loaded", str(error), DEFAULT_LIMITS, metrics)
    return judge_target(context, ran, "ran",
                        f"executed by executorch.runtime ({params.delegate})", DEFAULT_LIMITS, metrics)


def runner(context: VerifyContext[ExecutorchParams]) -> Runner:
    """The program in ExecuTorch's runtime; :class:`NotRunnable` for a Core ML program (macOS only)."""
    import executorch
    import torch
    from executorch.runtime import Runtime

    params = context.params
    if params.delegate == "coreml":
        # Loaded, to say it is a program ExecuTorch reads; its delegate runs on macOS only.
        Runtime.get().load_program(str(context.out_dir / PROGRAM_FILE))
        raise NotRunnable("a Core ML program runs on macOS only: loaded here, not executed")
    info = program_info(context.source)
    method = Runtime.get().load_program(str(context.out_dir / PROGRAM_FILE)).load_method("forward")
    names = output_names(info)
    inputs = input_specs(info)

    def run_one(feed: dict[str, Any]) -> dict[str, Any]:
        produced = method.execute(tuple(torch.from_numpy(feed[spec.name]) for spec in inputs))
        return {name: value.float().numpy() for name, value in zip(names, produced)}

    version = getattr(executorch, "__version__", "") or package_version("executorch")
    # Its thread count is not pinned for timing: resizing ExecuTorch's thread pool under a
    # loaded XNNPACK delegate crashed the process (_unsafe_reset_threadpool), so the
    # runtime's own choice is timed, recorded as such, and no ratio is stated.
    description = f"ExecuTorch {version} runtime ({params.delegate})"
    return Runner(description, inputs, names, run_one)


def float_limits(params: ExecutorchParams, output: str) -> OutputLimits:
    return params.verify.for_output(output, DEFAULT_LIMITS)
