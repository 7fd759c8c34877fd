"""Kind ``openvino``: a model's ``torch.export`` program as OpenVINO IR (``model.xml`` +
``model.bin``) for Intel CPUs, iGPUs and NPUs, optionally quantized to INT8 by NNCF;
checked on OpenVINO's CPU plugin in float32."""

from __future__ import annotations

from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, Starter, ParameterError, TensorSelection

from ..torch_export.targets import check_program_source, require_package
from .params import EXTRA, INFO_FILE, MODEL_FILE, WEIGHTS_FILE, OpenvinoParams

PREPROCESSOR_FILE = "preprocessor_config.json"


class Openvino(ArtifactKind):
    name = "openvino"
    summary = "a model's torch.export program -> OpenVINO IR (float, or INT8 by NNCF)"
    Params = OpenvinoParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    coverage_targets = ("openvino_cpu",)
    build_module = "edgebuild.kinds.openvino.build"
    verify_module = "edgebuild.kinds.openvino.verify"
    source_kinds = ("torch_export",)
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
    memory_factor = 3.0

    def tensor_selection(self, params: ArtifactParams, checkpoint: Checkpoint) -> TensorSelection | None:
        assert isinstance(params, OpenvinoParams)
        # Calibration images go through the image processor of the checkpoint behind the source.
        return TensorSelection(prefixes=(), files=(PREPROCESSOR_FILE,)) if params.calibration.images else None

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, Checkpoint]) -> None:
        assert isinstance(params, OpenvinoParams)
        require_package("openvino", EXTRA, self.name)
        if params.quantize == "int8":
            require_package("nncf", EXTRA, self.name)
            if len(checkpoints) != 1:
                raise ParameterError(f"expected one checkpoint behind the source, found {len(checkpoints)}", key="source")

    def check_sources(self, params: ArtifactParams, sources: dict[str, ArtifactParams]) -> None:
        assert isinstance(params, OpenvinoParams)
        check_program_source(self.name, params, sources, dynamic=True)
