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

from edgebuild.ml.qdq import QUANTIZE_IMPORTS, check_quantizable_source
from edgebuild.models.graph_inputs import PIXEL_INPUT
from edgebuild.models.hf import TRANSFORMERS_IMPORTS
from edgebuild.models.sample_images import starter_samples
from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, ParameterError, Process, Starter, TensorSelection
from edgebuild.targets.formats import EXPORTED_GRAPH, ONNX_GRAPH, QDQ_GRAPH

from .params import INFO_FILE, MODEL_FILE, WEIGHTS_FILE, OnnxQdqParams

PREPROCESSOR_FILE = "preprocessor_config.json"


class OnnxQdq(ArtifactKind[OnnxQdqParams]):
    name = "onnx_qdq"
    summary = "float ONNX graph -> static QDQ ONNX (QNN recipe or generic)"
    Params = OnnxQdqParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    step = "quantization"
    consumes = (EXPORTED_GRAPH,)
    produces = (ONNX_GRAPH, QDQ_GRAPH)
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.onnx_qdq.build"
    verify_module = "edgebuild.kinds.onnx_qdq.verify"
    # Like the tower's QDQ: calibration sessions over the float graph.
    process = Process(memory_factor=3.0, worker_imports=TRANSFORMERS_IMPORTS + QUANTIZE_IMPORTS)
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

    def tensor_selection(self, params: OnnxQdqParams, checkpoint: Checkpoint) -> TensorSelection | None:
        # The image processor's file only when images go through it.
        return TensorSelection(prefixes=(), files=(PREPROCESSOR_FILE,)) if params.reads_images() else None

    def check_parameters(self, params: OnnxQdqParams, checkpoints: dict[str, Checkpoint]) -> None:
        if len(checkpoints) != 1:
            raise ParameterError(f"expected one checkpoint behind {params.source!r}, found {len(checkpoints)}", key="source")

    def check_sources(self, params: OnnxQdqParams, sources: dict[str, ArtifactParams]) -> None:
        source = sources[params.source]
        check_quantizable_source(params.source, source, params.activation_type, params.weight_type)
        inputs = getattr(source, "inputs", {})
        if params.reads_images() and (PIXEL_INPUT not in inputs or len(inputs[PIXEL_INPUT].shape) != 4):
            raise ParameterError(f"images need a {PIXEL_INPUT} input of shape [batch, channels, height, width], and "
                                 f"source {params.source!r} takes {', '.join(inputs) or 'none'}", key="calibration")
