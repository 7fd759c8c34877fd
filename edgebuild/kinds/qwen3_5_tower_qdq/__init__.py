"""Kind ``qwen3_5_tower_qdq``: a float32 tower graph statically quantized to QDQ for an NPU.

onnxruntime's QNN recipe, unchanged: ``get_qnn_qdq_config(model, reader,
activation_type=..., weight_type=...)`` and its quantizer, on the source tower's
``model.onnx`` with external data; by default 16-bit activations and 8-bit weights
("A16W8"). Calibration inputs are images run through the steps of the checkpoint's
``Qwen2VLImageProcessor`` at the tower's size (``inputs.py``) and/or ready-made
``patches`` files. ``qdq.py`` runs the recipe in bounded memory, ``graph.py`` reads
what the quantized graph holds, ``build.py`` writes the graph and a sidecar naming
what was quantized, ``verify.py`` judges it against the float graph.

The artifact has no checkpoint of its own: it reads its source's. What the source
read (the tower's tensors, ``vision_config``) is in the source's fingerprint; what
this kind reads there itself -- ``preprocessor_config.json``, and ``vision_config``
to check it against -- is its own :meth:`tensor_selection`, applied to the
checkpoint behind the source.
"""

from __future__ import annotations

from edgebuild.ml.qdq import QUANTIZE_IMPORTS, SIXTEEN_BIT_OPSET, SIXTEEN_BIT_TYPES
from edgebuild.ml.sample_images import starter_samples
from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, ParameterError, Starter, TensorSelection

from ..qwen3_5_tower.params import TowerParams
from ..qwen3_5_tower.images import read_preprocessor_config
from .params import INFO_FILE, MODEL_FILE, PREPROCESSOR_FILE, WEIGHTS_FILE, QdqParams


class Qwen3_5TowerQdq(ArtifactKind):
    name = "qwen3_5_tower_qdq"
    summary = "Qwen3.5 vision tower -> static QDQ ONNX for QNN (A16W8 by default)"
    Params = QdqParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.qwen3_5_tower_qdq.build"
    verify_module = "edgebuild.kinds.qwen3_5_tower_qdq.verify"
    # Full-size QDQ at 224: 2.62x the float32 weights.
    memory_factor = 3.0
    # Not transformers: its image processors import its model code (see ..qwen3_5_tower.images).
    worker_imports = QUANTIZE_IMPORTS
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
    source_kinds = ("qwen3_5_vision_tower",)

    def tensor_selection(self, params: ArtifactParams, checkpoint: Checkpoint) -> TensorSelection:
        assert isinstance(params, QdqParams)
        # The image processor's file only when images go through it: patches files alone
        # need no preprocessor_config.json.
        reads_images = bool(params.calibration.images or params.held_out.images)
        return TensorSelection(prefixes=(), config_key="vision_config", files=(PREPROCESSOR_FILE,) if reads_images else ())

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, Checkpoint]) -> None:
        assert isinstance(params, QdqParams)
        if len(checkpoints) != 1:
            raise ParameterError(f"expected one checkpoint behind {params.source!r}, found {len(checkpoints)}", key="source")
        if params.calibration.images or params.held_out.images:
            (checkpoint,) = checkpoints.values()
            read_preprocessor_config(checkpoint)

    def check_sources(self, params: ArtifactParams, sources: dict[str, ArtifactParams]) -> None:
        assert isinstance(params, QdqParams)
        source = sources[params.source]
        assert isinstance(source, TowerParams)
        if source.dtype != "float32":
            raise ParameterError(
                f"source {params.source!r} is a {source.dtype} tower; expected a float32 one "
                f"(the quantizer calibrates and quantizes from float32)",
                key="source",
            )
        for key in ("activation_type", "weight_type"):
            value = getattr(params, key)
            if value in SIXTEEN_BIT_TYPES and source.opset < SIXTEEN_BIT_OPSET:
                raise ParameterError(
                    f"{value} needs opset {SIXTEEN_BIT_OPSET} (16-bit QuantizeLinear/DequantizeLinear in ai.onnx), "
                    f"but source {params.source!r} is exported at opset {source.opset}; "
                    f"set its opset to {SIXTEEN_BIT_OPSET}, or use an 8-bit {key}",
                    key=key,
                )
