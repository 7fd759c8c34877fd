"""Kind ``siglip_f143_onnx``: a ``siglip_f143`` artifact as one ONNX graph with FP8 weights.

An NPU or iGPU runtime consumes ONNX, not SafeTensors. ONNX has F143's exact
type (``FLOAT8E4M3FNUZ``) and, from opset 21, blocked ``DequantizeLinear``, so
each quantized linear is stored as its float8 codes plus one power-of-two scale
per 64 input features and output feature (each 64x64 tile's exponent, repeated
over its 64 rows), and dequantized in the graph. onnxruntime's CPU provider
runs that bit-exactly, so the graph computes with exactly the SafeTensors
artifact's weights.

The graph is torch's dynamo export of transformers' ``SiglipVisionModel``
carrying the quantized weights; the exporter folds each linear's weight into a
transposed ``[in, out]`` initializer for ``MatMul``, which is found by value
(not by name or string surgery) and rewritten with the ``onnx`` API. The
blocked axis is therefore the input-feature axis of whichever layout the
exporter chose: axis 0 for ``MatMul``'s ``[in, out]``, axis 1 for ``[out, in]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.ml.onnx_tools import EXPORT_IMPORTS, EXPORT_WARMUPS
from edgebuild.models.hf import TRANSFORMERS_IMPORTS
from edgebuild.models.siglip.f143 import F143_ENCODER
from edgebuild.models.siglip.model import PREPROCESSOR_FILE, siglip_layout
from edgebuild.plugin import ArtifactKind, Checkpoint, ParameterError, Plots, Process, Starter, TensorSelection
from edgebuild.targets.formats import ONNX_GRAPH

from .params import INFO_FILE, MODEL_FILE, WEIGHTS_FILE, SiglipOnnxParams


class SiglipF143Onnx(ArtifactKind[SiglipOnnxParams]):
    name = "siglip_f143_onnx"
    summary = "F143 SigLIP encoder -> ONNX with FP8 (FLOAT8E4M3FNUZ) weights"
    Params = SiglipOnnxParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    consumes = (F143_ENCODER,)
    produces = (ONNX_GRAPH,)
    step = "export"
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.siglip_f143_onnx.build"
    verify_module = "edgebuild.kinds.siglip_f143_onnx.verify"
    process = Process(
        # Not measured at full size; an export plus onnxruntime sessions, like the tower.
        memory_factor=3.0,
        # Its model's module too: the build exports SiglipVisionModel and the verification runs it.
        worker_imports=TRANSFORMERS_IMPORTS + EXPORT_IMPORTS + ("transformers.models.siglip.modeling_siglip",),
        build_warmups=EXPORT_WARMUPS,
    )
    starter = Starter(
        entry="""\
  # That F143 encoder as one ONNX graph: FP8 weights, dequantized in the graph.
  siglip_f143_gptq_onnx:
    kind: siglip_f143_onnx
    description: the F143 SigLIP encoder as ONNX with FP8 weights
    source: siglip_f143_gptq             # the siglip_f143 artifact above
    weights: fp8                         # fp8 | float (a plain graph to compare against)
""",
    )

    def tensor_selection(self, params: SiglipOnnxParams, checkpoint: Checkpoint) -> TensorSelection:
        # What it reads of the float checkpoint behind its source itself: verification
        # compares with the float encoder (its tensors, its config) on held-out images run
        # through its image processor. The source is in its fingerprint by its bytes only.
        return TensorSelection(prefixes=(siglip_layout(checkpoint).prefix,), config_key=None, files=(PREPROCESSOR_FILE,))

    def check_parameters(self, params: SiglipOnnxParams, checkpoints: dict[str, Checkpoint]) -> None:
        if len(checkpoints) != 1:
            raise ParameterError(f"expected one float checkpoint behind {params.source!r}, found {len(checkpoints)}", key="source")

    def report_figures(self, name: str, directory: Path, report: dict[str, Any], uid: str) -> Plots:
        from .figures import onnx_figures

        return onnx_figures(name, directory, report, uid)
