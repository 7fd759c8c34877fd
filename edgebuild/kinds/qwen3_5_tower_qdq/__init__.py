"""Kind ``qwen3_5_tower_qdq``: a float32 tower graph statically quantized to QDQ for an NPU.

onnxruntime's QNN recipe, unchanged: ``get_qnn_qdq_config(model, reader,
activation_type=..., weight_type=...)`` and its quantizer, on the source tower's
``model.onnx`` with external data; by default 16-bit activations and 8-bit weights
("A16W8"). Calibration inputs are images run through the steps of the checkpoint's
``Qwen2VLImageProcessor`` at the tower's size (``edgebuild/models/qwen3_5/inputs.py``)
and/or ready-made ``patches`` files. ``edgebuild/ml/qdq.py`` runs the recipe in bounded
memory, ``build.py`` writes the graph and a sidecar naming what was quantized,
``verify.py`` judges it against the float graph.

The artifact has no checkpoint of its own: it reads its source's. What the source
read (the tower's tensors, ``vision_config``) is in the source's fingerprint; what
this kind reads there itself -- ``preprocessor_config.json``, and ``vision_config``
to check it against -- is its own :meth:`tensor_selection`, applied to the
checkpoint behind the source.
"""

from __future__ import annotations

from edgebuild.ml.qdq import QUANTIZE_IMPORTS, check_quantizable_source
from edgebuild.models.qwen3_5.geometry import TOWER_GRAPH
from edgebuild.models.qwen3_5.images import read_preprocessor_config
from edgebuild.models.sample_images import starter_samples
from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, ParameterError, Process, Starter, TensorSelection
from edgebuild.targets.formats import ONNX_GRAPH, QDQ_GRAPH

from .params import INFO_FILE, MODEL_FILE, PREPROCESSOR_FILE, WEIGHTS_FILE, QdqParams


class Qwen3_5TowerQdq(ArtifactKind[QdqParams]):
    name = "qwen3_5_tower_qdq"
    summary = "Qwen3.5 vision tower -> static QDQ ONNX for QNN (A16W8 by default)"
    Params = QdqParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    step = "quantization"
    consumes = (TOWER_GRAPH,)
    produces = (ONNX_GRAPH, QDQ_GRAPH)
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.qwen3_5_tower_qdq.build"
    verify_module = "edgebuild.kinds.qwen3_5_tower_qdq.verify"
    process = Process(
        # Full-size QDQ at 224: 2.62x the float32 weights.
        memory_factor=3.0,
        # Not transformers: its image processors import its model code (edgebuild/models/qwen3_5/images.py).
        worker_imports=QUANTIZE_IMPORTS,
    )
    starter = Starter(
        entry="""\
  # The float tower quantized for an NPU: 16-bit activations, 8-bit weights (A16W8)
  # as QDQ ONNX, calibrated on images run through the checkpoint's image processor.
  tower_224_qdq:
    kind: qwen3_5_tower_qdq
    description: the 224 tower, A16W8 QDQ
    source: tower_224_fp32               # a float32 qwen3_5_vision_tower at opset 21
    calibration:
      images: [data/calibration/*.png]
    held_out:
      images: [data/held_out/*.png]      # verification only
    activation_type: uint16              # uint16 | uint8
    weight_type: uint8                   # uint8 | int8 | uint16
""",
        samples=starter_samples(),
    )

    def tensor_selection(self, params: QdqParams, checkpoint: Checkpoint) -> TensorSelection:
        # The image processor's file only when images go through it: patches files alone
        # need no preprocessor_config.json.
        reads_images = bool(params.calibration.images or params.held_out.images)
        return TensorSelection(prefixes=(), config_key="vision_config", files=(PREPROCESSOR_FILE,) if reads_images else ())

    def check_parameters(self, params: QdqParams, checkpoints: dict[str, Checkpoint]) -> None:
        if len(checkpoints) != 1:
            raise ParameterError(f"expected one checkpoint behind {params.source!r}, found {len(checkpoints)}", key="source")
        if params.calibration.images or params.held_out.images:
            (checkpoint,) = checkpoints.values()
            read_preprocessor_config(checkpoint)

    def check_sources(self, params: QdqParams, sources: dict[str, ArtifactParams]) -> None:
        check_quantizable_source(params.source, sources[params.source], params.activation_type, params.weight_type)
