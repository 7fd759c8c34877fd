"""Kind ``qwen3_5_vision_tower``: a Qwen3.5 vision tower as one fixed-shape ONNX graph.

The model definition is transformers' own ``Qwen3_5VisionModel``; nothing here
re-writes it (``edgebuild/models/qwen3_5``: its geometry, the fixed-shape wrapper, its
image steps). ``build.py`` exports it, ``verify.py`` judges the export against the
model's own forward.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.ml.onnx_tools import EXPORT_IMPORTS, EXPORT_WARMUPS
from edgebuild.models.hf import TRANSFORMERS_IMPORTS
from edgebuild.models.qwen3_5.fixtures import FIXTURES
from edgebuild.models.qwen3_5.geometry import (GEOMETRY_FILE, PREPROCESSOR_FILE, TOWER_GRAPH, VISUAL_PREFIX,
                                               check_vision_config, tower_geometry)
from edgebuild.plugin import ArtifactKind, Checkpoint, ParameterError, Plots, Process, Starter, TensorSelection
from edgebuild.targets.formats import ONNX_GRAPH

from .params import MODEL_FILE, WEIGHTS_FILE, TowerParams


class Qwen3_5VisionTower(ArtifactKind[TowerParams]):
    name = "qwen3_5_vision_tower"
    summary = "Qwen3.5 vision tower -> fixed-shape ONNX"
    Params = TowerParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, GEOMETRY_FILE)
    produces = (ONNX_GRAPH, TOWER_GRAPH)
    step = "export"
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.qwen3_5_tower.build"
    verify_module = "edgebuild.kinds.qwen3_5_tower.verify"
    process = Process(
        # Full-size tower (1.72 GiB float32): verification peaked at 2.95x, the build at 1.65x.
        memory_factor=3.0,
        # Its model's module too: every build and verification loads Qwen3_5VisionModel, and its
        # module took about 0.3 s to import in each worker after transformers' common ones.
        worker_imports=TRANSFORMERS_IMPORTS + EXPORT_IMPORTS + ("transformers.models.qwen3_5.modeling_qwen3_5",),
        build_warmups=EXPORT_WARMUPS,
    )
    fixtures = FIXTURES
    starter = Starter(
        checkpoints={"qwen3_5": "qwen3_5_vl_tiny"},
        entry="""\
  # The Qwen3.5 vision tower as one fixed-shape ONNX graph, checked against the
  # model's own forward in onnxruntime.
  tower_224_fp32:
    kind: qwen3_5_vision_tower
    description: Qwen3.5 vision tower, one 224x224 image, float32
    checkpoint: qwen3_5
    image_size: 224          # or [height, width]: multiples of patch_size x spatial_merge_size
    dtype: fp32              # fp32 | fp16
    opset: 21
    # verify:                # thresholds; unset ones take the dtype's defaults
    #   cosine_min: 0.9999
    #   max_abs: 1.0e-4
""",
    )

    def tensor_selection(self, params: TowerParams, checkpoint: Checkpoint) -> TensorSelection:
        # The tower alone: a plain release and its FP8 release (text weights float8 with
        # scales, a quantization_config) share it, and so share the fingerprint.
        # And the image processor's file, when the checkpoint ships one: not read by the
        # export, but carried in the build's consumer.json (how an image becomes the
        # tower's patches), so it must be in the fingerprint.
        files = (PREPROCESSOR_FILE,) if checkpoint.has_file(PREPROCESSOR_FILE) else ()
        return TensorSelection(prefixes=(VISUAL_PREFIX,), config_key="vision_config", files=files)

    def consumer_preprocessing(self, params: TowerParams) -> dict[str, Any]:
        height, width = params.image_size
        # The graph is fixed at one image size: a consumer resizes to it, and gives the
        # processor a pixel budget of exactly that size, so that it keeps it as it is.
        return {"image_size": [height, width],
                "image_processor_overrides": {"size": {"shortest_edge": height * width, "longest_edge": height * width}}}

    def check_parameters(self, params: TowerParams, checkpoints: dict[str, Checkpoint]) -> None:
        checkpoint = checkpoints[params.checkpoint]
        vision_config = check_vision_config(checkpoint)
        checkpoint.once(("float tensors", VISUAL_PREFIX),
                        lambda: checkpoint.check_float_tensors(checkpoint.select((VISUAL_PREFIX,))))
        try:
            tower_geometry(vision_config, params.image_size)
        except ParameterError as error:
            raise ParameterError(f"{error} (vision_config of {checkpoint.label})", key="image_size") from None

    def report_figures(self, name: str, directory: Path, report: dict[str, Any], uid: str) -> Plots:
        from .figures import tower_figures

        return tower_figures(name, directory, report, uid)
