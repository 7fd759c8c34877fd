"""Kind ``qnn_context``: a QDQ graph compiled by Qualcomm's QNN for a Snapdragon NPU.

onnxruntime's EPContext generation with the QNN execution provider on the HTP
backend: the output is a tiny ONNX graph of ``EPContext`` nodes and the compiled
context binary beside it, which onnxruntime on the device loads without compiling
again. Built with CPU fallback disabled, so a graph QNN cannot take whole fails the
build instead of quietly leaving nodes to the CPU. ``qnn.py`` finds the provider
(the optional ``onnxruntime-qnn`` plugin), ``build.py`` compiles, ``verify.py``
checks the placement and, for graphs small enough, runs the compiled context on
the HTP simulator against the QDQ graph on the CPU.
"""

from __future__ import annotations

from edgebuild.plugin import ArtifactKind, Process, Starter
from edgebuild.targets.formats import QDQ_GRAPH

from .coverage import QNN_CONTEXT
from .params import CONTEXT_BINARY_FILE, INFO_FILE, MODEL_FILE, QNN_PACKAGE, QnnParams


class QnnContext(ArtifactKind[QnnParams]):
    name = "qnn_context"
    summary = "QDQ graph -> QNN HTP context binary (EPContext), Snapdragon X by default"
    Params = QnnParams
    outputs = (MODEL_FILE, CONTEXT_BINARY_FILE, INFO_FILE)
    step = "compilation"
    consumes = (QDQ_GRAPH,)
    produces = (QNN_CONTEXT,)
    coverage_targets = ("qnn_htp",)
    build_module = "edgebuild.kinds.qnn_context.build"
    verify_module = "edgebuild.kinds.qnn_context.verify"
    # Compiling the full-size QDQ tower's context: 2.6 GiB against 1.72 GiB of source weights.
    process = Process(memory_factor=2.0)
    starter = Starter(
        entry="""\
  # That QDQ graph compiled into a QNN HTP context binary for Snapdragon X; the HTP
  # simulator's output is checked against the QDQ graph on the CPU.
  tower_224_qnn_x:
    kind: qnn_context
    description: the A16W8 224 tower as a QNN context for Snapdragon X (HTP v73)
    source: tower_224_qdq
    soc_model: 60
    htp_arch: 73
""",
        extra="qnn",
        extra_module="onnxruntime_qnn",
    )
    tool_packages = (QNN_PACKAGE,)
