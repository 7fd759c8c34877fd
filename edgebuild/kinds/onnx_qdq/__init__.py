"""Kind ``onnx_qdq``: a float ONNX graph statically quantized to QDQ, for an NPU or a CPU.

onnxruntime's quantizer on any artifact that writes ``model.onnx`` with its inputs'
signature (an ``hf_onnx`` export): the QNN recipe (``get_qnn_qdq_config``, 16-bit
activations and 8-bit weights by default) or the generic one (``quantize_static`` in
QDQ format), calibrated in bounded memory (``edgebuild/ml/qdq.py``) on images run
through the source checkpoint's own image processor, or on tensors from SafeTensors
files. ``verify.py`` compares the QDQ graph with the float graph on held-out inputs
and checks what the graph holds.

The artifact has no checkpoint of its own: what it reads of the checkpoint behind its
source -- the image processor's ``preprocessor_config.json``, when images are given --
is its own :meth:`tensor_selection`.
"""

from __future__ import annotations

from edgebuild.ml.graph_inputs import PIXEL_INPUT
from edgebuild.ml.hf import TRANSFORMERS_IMPORTS
from edgebuild.ml.qdq import QUANTIZE_IMPORTS, SIXTEEN_BIT_OPSET, SIXTEEN_BIT_TYPES
from edgebuild.ml.sample_images import starter_samples
from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, ParameterError, Starter, TensorSelection

from .params import INFO_FILE, MODEL_FILE, WEIGHTS_FILE, OnnxQdqParams

PREPROCESSOR_FILE = "preprocessor_config.json"


class OnnxQdq(ArtifactKind):
    name = "onnx_qdq"
    summary = "float ONNX graph -> static QDQ ONNX (QNN recipe or generic)"
    Params = OnnxQdqParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.onnx_qdq.build"
    verify_module = "edgebuild.kinds.onnx_qdq.verify"
    source_kinds = ("hf_onnx",)
    # Like the tower's QDQ: calibration sessions over the float graph.
    memory_factor = 3.0
    worker_imports = TRANSFORMERS_IMPORTS + QUANTIZE_IMPORTS
    starter = Starter(
        entry="""\
  # That graph quantized for an NPU: 16-bit activations, 8-bit weights (A16W8) as QDQ
  # ONNX, calibrated on images run through the checkpoint's own image processor.
  clip_64_qdq:
    kind: onnx_qdq
    description: the CLIP encoder, A16W8 QDQ for QNN
    source: clip_64
    calibration:
      images: [data/calibration/*.png]
    held_out:
      images: [data/held_out/*.png]      # verification only
    recipe: qnn                          # qnn | generic
    activation_type: uint16              # uint16 | uint8 (generic also int16 | int8)
    weight_type: uint8
""",
        samples=starter_samples(),
    )

    def tensor_selection(self, params: ArtifactParams, checkpoint: Checkpoint) -> TensorSelection | None:
        assert isinstance(params, OnnxQdqParams)
        # The image processor's file only when images go through it.
        return TensorSelection(prefixes=(), files=(PREPROCESSOR_FILE,)) if params.reads_images() else None

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, Checkpoint]) -> None:
        assert isinstance(params, OnnxQdqParams)
        if len(checkpoints) != 1:
            raise ParameterError(f"expected one checkpoint behind {params.source!r}, found {len(checkpoints)}", key="source")

    def check_sources(self, params: ArtifactParams, sources: dict[str, ArtifactParams]) -> None:
        assert isinstance(params, OnnxQdqParams)
        source = sources[params.source]
        if getattr(source, "dtype", "float32") != "float32":
            raise ParameterError(f"source {params.source!r} is a {source.dtype} graph; expected a float32 one "
                                 "(the quantizer calibrates and quantizes from float32)", key="source")
        for key in ("activation_type", "weight_type"):
            value = getattr(params, key)
            opset = getattr(source, "opset", SIXTEEN_BIT_OPSET)
            if value in SIXTEEN_BIT_TYPES and opset < SIXTEEN_BIT_OPSET:
                raise ParameterError(
                    f"{value} needs opset {SIXTEEN_BIT_OPSET} (16-bit QuantizeLinear/DequantizeLinear in ai.onnx), but "
                    f"source {params.source!r} is exported at opset {opset}; set its opset to {SIXTEEN_BIT_OPSET}, or use an "
                    f"8-bit {key}", key=key)
        inputs = getattr(source, "inputs", {})
        if params.reads_images() and (PIXEL_INPUT not in inputs or len(inputs[PIXEL_INPUT].shape) != 4):
            raise ParameterError(f"images need a {PIXEL_INPUT} input of shape [batch, channels, height, width], and "
                                 f"source {params.source!r} takes {', '.join(inputs) or 'none'}", key="calibration")
