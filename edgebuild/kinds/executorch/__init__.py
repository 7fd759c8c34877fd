"""Kind ``executorch``: a model's ``torch.export`` program lowered to an ExecuTorch ``.pte``.

XNNPACK's CPU delegate by default (``delegate: xnnpack``), ExecuTorch's portable kernels
(``portable``), or Apple's Core ML (``coreml``: built here, run only on macOS). The
model comes from a ``torch_export`` source, named or implied by the model keys given
inline (``edgebuild/kinds/torch_export``). ``verify.py`` runs the program in ExecuTorch's
runtime against the program it was lowered from; the engine also judges it against the
model's own forward (``vs_float.*``).
"""

from __future__ import annotations

from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, Starter

from ..torch_export.targets import check_program_source, require_package
from .params import EXTRA, INFO_FILE, PROGRAM_FILE, ExecutorchParams


class Executorch(ArtifactKind):
    name = "executorch"
    summary = "a model's torch.export program -> ExecuTorch .pte (XNNPACK, portable or Core ML)"
    Params = ExecutorchParams
    outputs = (PROGRAM_FILE, INFO_FILE)
    coverage_targets = ("xnnpack",)
    build_module = "edgebuild.kinds.executorch.build"
    verify_module = "edgebuild.kinds.executorch.verify"
    source_kinds = ("torch_export",)
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
    memory_factor = 3.0
    worker_imports = ("executorch.exir", "torch.export")
    build_imports = ("edgebuild.kinds.executorch.prepare",)

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, Checkpoint]) -> None:
        assert isinstance(params, ExecutorchParams)
        require_package("executorch", EXTRA, self.name)
        if params.delegate == "coreml":
            require_package("coremltools", EXTRA, self.name)

    def check_sources(self, params: ArtifactParams, sources: dict[str, ArtifactParams]) -> None:
        assert isinstance(params, ExecutorchParams)
        check_program_source(self.name, params, sources, dynamic=True)
