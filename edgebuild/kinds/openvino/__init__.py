"""Kind ``openvino``: a model's ``torch.export`` program as OpenVINO IR (``model.xml`` +
``model.bin``) for Intel CPUs, iGPUs and NPUs, optionally quantized to INT8 by NNCF;
checked on OpenVINO's CPU plugin in float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import Checkpoint, ParameterError, Process, Starter, TensorSelection
from edgebuild.targets.base import ProgramTarget, require_package

from .coverage import OPENVINO_IR
from .params import EXTRA, INFO_FILE, MODEL_FILE, WEIGHTS_FILE, OpenvinoParams

PREPROCESSOR_FILE = "preprocessor_config.json"


class Openvino(ProgramTarget[OpenvinoParams]):
    name = "openvino"
    summary = "a model's torch.export program -> OpenVINO IR (float, or INT8 by NNCF)"
    Params = OpenvinoParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    produces = (OPENVINO_IR,)
    coverage_targets = ("openvino_cpu",)
    build_module = "edgebuild.kinds.openvino.build"
    verify_module = "edgebuild.kinds.openvino.verify"
    requires = ("openvino",)
    extra = EXTRA
    starter = Starter(
        entry="""\
  # That program for Intel CPUs, iGPUs and NPUs: OpenVINO IR, run on the CPU plugin
  # in float32 and compared with the program and with transformers' forward.
  clip_64_ir:
    kind: openvino
    description: the CLIP encoder at 64x64 (openvino)
    source: clip_64_program
    quantize: none                     # none | int8 (with calibration: {images: [...]})
""",
        extra="openvino",
        extra_module="openvino",
    )
    tool_packages = ("openvino", "nncf")
    process = Process(memory_factor=3.0, quiet_loggers=("openvino", "nncf"))

    def tensor_selection(self, params: OpenvinoParams, checkpoint: Checkpoint) -> TensorSelection | None:
        # Calibration images go through the image processor of the checkpoint behind the source.
        return TensorSelection(prefixes=(), files=(PREPROCESSOR_FILE,)) if params.calibration.images else None

    def check_parameters(self, params: OpenvinoParams, checkpoints: dict[str, Checkpoint]) -> None:
        super().check_parameters(params, checkpoints)
        if params.quantize == "int8":
            require_package("nncf", EXTRA, self.name)
            if len(checkpoints) != 1:
                raise ParameterError(f"expected one checkpoint behind the source, found {len(checkpoints)}", key="source")

    def consumer_programs(self, params: OpenvinoParams, out_dir: Path, sources: dict[str, Path]) -> dict[str, Any]:
        # In the build module, so that its code is in the fingerprint.
        from .build import program_signature

        return {MODEL_FILE: program_signature(out_dir / MODEL_FILE)}
