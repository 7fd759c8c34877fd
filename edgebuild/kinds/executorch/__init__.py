"""Kind ``executorch``: a model's ``torch.export`` program lowered to an ExecuTorch ``.pte``.

XNNPACK's CPU delegate by default (``delegate: xnnpack``), ExecuTorch's portable kernels
(``portable``), or Apple's Core ML (``coreml``: built here, run only on macOS). The
model comes from a ``torch_export`` source, named or implied by the model keys given
inline (``edgebuild/targets/params.py``). ``verify.py`` runs the program in ExecuTorch's
runtime against the program it was lowered from; the engine also judges it against the
model's own forward (``vs_float.*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import Checkpoint, Process, Starter
from edgebuild.targets.base import ProgramTarget, require_package

from .coverage import EXECUTORCH_PROGRAM
from .params import EXTRA, INFO_FILE, PROGRAM_FILE, ExecutorchParams


class Executorch(ProgramTarget[ExecutorchParams]):
    name = "executorch"
    summary = "a model's torch.export program -> ExecuTorch .pte (XNNPACK, portable or Core ML)"
    Params = ExecutorchParams
    outputs = (PROGRAM_FILE, INFO_FILE)
    produces = (EXECUTORCH_PROGRAM,)
    coverage_targets = ("xnnpack",)
    build_module = "edgebuild.kinds.executorch.build"
    verify_module = "edgebuild.kinds.executorch.verify"
    requires = ("executorch",)
    extra = EXTRA
    starter = Starter(
        entry="""\
  # That program for phones: an ExecuTorch .pte, XNNPACK-delegated, run in ExecuTorch's
  # runtime and compared with the program and with transformers' forward.
  clip_64_pte:
    kind: executorch
    description: the CLIP encoder at 64x64 (executorch)
    source: clip_64_program
    delegate: xnnpack                  # xnnpack | portable | coreml (macOS runs it)
""",
        extra="executorch",
        extra_module="executorch",
    )
    tool_packages = ("executorch", "torchao")
    process = Process(
        memory_factor=3.0,
        worker_imports=("executorch.exir", "torch.export"),
        build_imports=("edgebuild.kinds.executorch.prepare",),
        quiet_loggers=("executorch", "coremltools"),
    )

    def check_parameters(self, params: ExecutorchParams, checkpoints: dict[str, Checkpoint]) -> None:
        super().check_parameters(params, checkpoints)
        if params.delegate == "coreml":
            require_package("coremltools", EXTRA, self.name)

    def consumer_programs(self, params: ExecutorchParams, out_dir: Path, sources: dict[str, Path]) -> dict[str, Any]:
        # In the build module, so that its code is in the fingerprint.
        from .build import program_signature

        assert params.source is not None
        return {PROGRAM_FILE: program_signature(out_dir / PROGRAM_FILE, sources[params.source])}
