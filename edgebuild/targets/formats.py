"""The formats kinds pass between them: what an artifact is, as the files another kind
reads of it (``Format``), with the coverage certificates those files can answer. A kind
declares the formats it ``produces`` and those it ``consumes``; kinds name formats,
never each other.

Data only (names, files, where each certificate is computed): importing this module
runs nothing, so a kind that reads a format's file names depends on this alone.
"""

from __future__ import annotations

from edgebuild.core.kind import CoverageTarget, Format

# --- an ONNX graph, and what its static tables say -------------------------------------------

MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
_ONNX_CERTIFICATES = "edgebuild.targets.onnx_graph"
# Every op type an ONNX graph may hold: the standard's and onnxruntime's contrib operators.
ONNX_OP_TYPES = "edgebuild.targets.onnx_ops:onnx_op_types"
NNAPI = CoverageTarget("nnapi", "NNAPI (onnxruntime's mobile usability checker: its static table)",
                       f"{_ONNX_CERTIFICATES}:nnapi", tool_packages=("onnxruntime",), vocabulary="ONNX op types",
                       op_types=ONNX_OP_TYPES)
COREML = CoverageTarget("coreml", "Core ML MLProgram (onnxruntime's mobile usability checker: its static table)",
                        f"{_ONNX_CERTIFICATES}:coreml", tool_packages=("onnxruntime",), vocabulary="ONNX op types",
                        op_types=ONNX_OP_TYPES)
DIRECTML = CoverageTarget("directml", "DirectML (the static table of onnxruntime's DML kernel registrations)",
                          f"{_ONNX_CERTIFICATES}:directml", vocabulary="ONNX op types", op_types=ONNX_OP_TYPES)
# Any ONNX graph: what every exporter and quantizer writes.
ONNX_GRAPH = Format("onnx_graph", "an ONNX graph", (MODEL_FILE,), certificates=(NNAPI, COREML, DIRECTML))

# An exported graph that says what it takes: its inputs' names, shapes and dtypes (and its
# outputs'), what a quantizer calibrating it needs.
SIGNATURE_FILE = "export.json"
EXPORTED_GRAPH = Format("onnx_export", "an exported ONNX graph with its inputs' signature",
                        (MODEL_FILE, WEIGHTS_FILE, SIGNATURE_FILE))

# --- a statically quantized graph ------------------------------------------------------------

QDQ_INFO_FILE = "qdq.json"
QDQ_INFO_FORMAT = 1
# What an NPU's compiler takes: a QDQ graph with its weights beside it, and what was quantized.
QDQ_GRAPH = Format("qdq_graph", "a QDQ graph", (MODEL_FILE, WEIGHTS_FILE, QDQ_INFO_FILE))

# --- a torch.export program --------------------------------------------------------------------

PROGRAM_FILE = "program.pt2"
PROGRAM_INFO_FILE = "export.json"
PROGRAM_INFO_FORMAT = 1
# What every target that lowers a model takes: the program and what goes in and comes out.
TORCH_PROGRAM = Format("torch_program", "a torch.export program",
                       (PROGRAM_FILE, PROGRAM_INFO_FILE))
# The kind that exports a model description to a program: what a target describing its
# model inline implies (``ArtifactParams.implied_source``).
PROGRAM_KIND = "torch_export"
