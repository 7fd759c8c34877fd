"""Kind ``torch_export``: a model at given shapes, exported once by ``torch.export``, the
program every target lowers from.

A model description (``edgebuild/models/fields.py``: a transformers class from a
checkpoint, or the Qwen3.5 tower at an image size: ``edgebuild/models/families.py``) is
exported to ``program.pt2`` (a :data:`~edgebuild.targets.formats.TORCH_PROGRAM`), which
every target kind lowers. A target that describes its model inline implies this artifact
(named ``<target>.torch_export``, one for every target of the same model), so N targets
of one model pay one export, and a program rebuilt to the same bytes rebuilds no target
(they are keyed by its bytes). ``verify.py`` judges the program against the model's own
forward, the float model of every target's chain.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.models.families import BUILT_IN, family_of, plugin_family
from edgebuild.models.hf import TRANSFORMERS_IMPORTS
from edgebuild.models.hf_fixtures import FIXTURES as HF_FIXTURES
from edgebuild.models.qwen3_5.fixtures import FIXTURES as QWEN3_5_FIXTURES
from edgebuild.models.sample_images import starter_samples
from edgebuild.plugin import ArtifactKind, Checkpoint, Process, Starter, TensorSelection
from edgebuild.targets.formats import PROGRAM_FILE, PROGRAM_INFO_FILE, TORCH_PROGRAM
from edgebuild.targets.program import PROGRAM_IMPORTS

from .params import TorchExportParams


class TorchExport(ArtifactKind[TorchExportParams]):
    name = "torch_export"
    summary = "a model at given shapes -> one torch.export program (what the targets lower from)"
    Params = TorchExportParams
    outputs = (PROGRAM_FILE, PROGRAM_INFO_FILE)
    produces = (TORCH_PROGRAM,)
    step = "export"
    build_module = "edgebuild.kinds.torch_export.build"
    verify_module = "edgebuild.kinds.torch_export.verify"
    # The model, its traced program and the program's module beside it.
    process = Process(memory_factor=3.0, worker_imports=TRANSFORMERS_IMPORTS + PROGRAM_IMPORTS)
    # Any transformers encoder, or the Qwen3.5 tower: the generated checkpoints of both.
    fixtures = HF_FIXTURES + QWEN3_5_FIXTURES
    starter = Starter(
        checkpoints={"clip": "clip_vision_tiny"},
        entry="""\
  # One model at given shapes, exported once by torch.export: the program the targets
  # below (ExecuTorch, OpenVINO, LiteRT) lower from. A target may also describe its model
  # itself (checkpoint, model_class, inputs, ...), which implies such a program.
  clip_64_program:
    kind: torch_export
    description: the CLIP encoder at 64x64, as one torch.export program
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}   # or {shape: [2, 3, 64, 64], dynamic: {0: [2, 8]}}
    outputs: [pooler_output]
    held_out:
      images: [data/held_out/*.png]      # the targets are judged on them too
""",
        samples=starter_samples(),
    )

    def tensor_selection(self, params: TorchExportParams, checkpoint: Checkpoint) -> TensorSelection:
        return family_of(params).selection(params, checkpoint)

    def check_parameters(self, params: TorchExportParams, checkpoints: dict[str, Checkpoint]) -> None:
        family_of(params).check(params, checkpoints[params.checkpoint])

    def check_deeply(self, params: TorchExportParams, checkpoints: dict[str, Checkpoint]) -> None:
        family_of(params).check_deeply(params, checkpoints[params.checkpoint])

    def consumer_programs(self, params: TorchExportParams, out_dir: Path, sources: dict[str, Path]) -> dict[str, Any]:
        # targets/program.py is in the build module's imports, so in the fingerprint.
        from edgebuild.targets.program import program_signature

        return {PROGRAM_FILE: program_signature(out_dir)}

    def code_roots(self, params: TorchExportParams) -> tuple[str, ...]:
        if params.model_class in BUILT_IN:
            return ()
        point = plugin_family(params.model_class)
        # Another package's family: its module's code is in the fingerprint.
        return (point.module,) if point is not None else ()
