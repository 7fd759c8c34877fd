"""The ``qnn_context`` manifest parameters, its thresholds and the files it writes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgebuild.plugin import ArtifactParams, VerifySettings
from edgebuild.targets.formats import MODEL_FILE, WEIGHTS_FILE

# The EPContext graph (named as its source's), and the compiled context binary onnxruntime names after it.
# What every QDQ source writes: the graph and its external weights (formats.QDQ_GRAPH).
SOURCE_MODEL_FILE = MODEL_FILE
SOURCE_WEIGHTS_FILE = WEIGHTS_FILE
CONTEXT_BINARY_FILE = "model_qnn.bin"
INFO_FILE = "context.json"
INFO_FORMAT = 1
PROVIDER = "QNNExecutionProvider"
# The package that brings the provider (a plugin library for onnxruntime) and the HTP backend.
QNN_PACKAGE = "onnxruntime-qnn"

# Snapdragon X (X Elite / X Plus): the laptop NPU this graph is compiled for by default.
SNAPDRAGON_X_SOC_MODEL = 60
SNAPDRAGON_X_HTP_ARCH = 73


class QnnVerify(VerifySettings):
    """The HTP simulator's output against the QDQ graph on onnxruntime's CPU provider.

    Both run the same quantized graph, so they differ only by the backends' integer
    arithmetic and requantization rounding. Measured on the tiny A16W8 tower (docs/kinds/qnn_context.md,
    ``qnn_context``): at 64x64 cosine 0.99997, mean abs 0.0040, max abs 0.016; at
    224x224 cosine 0.999993, mean abs 0.0022, max abs 0.019 (outputs up to ~3).
    """

    simulate_max_weight_mib: float = Field(
        default=16.0, ge=0.0,
        description="Run the HTP simulator only for a source whose weights file is at most this large "
                    "(the x86 simulator is slow: seconds for the tiny tower, hours for a full-size one); "
                    "above it, neither the simulator check nor vs_float is measured, and the report says so.",
    )
    cosine_min: float = Field(
        default=0.9995, ge=-1.0, le=1.0,
        description="Least cosine, simulator vs the QDQ graph on the CPU.",
    )
    mean_abs: float = Field(default=0.02, ge=0.0, description="Largest mean absolute error, simulator vs CPU.")
    max_abs: float = Field(default=0.1, ge=0.0, description="Largest absolute error, simulator vs CPU.")
    max_partitions: int = Field(default=1, ge=1, description="QNN partitions the graph may be split into.")
    samples: int = Field(default=2, ge=1, le=16, description="Random inputs: floats uniform in [-1, 1], masks all ones, "
                                                            "other integers zero.")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class QnnParams(ArtifactParams):
    kind: Literal["qnn_context"]
    source: str = Field(description="The QDQ graph to compile (an onnx_qdq or qwen3_5_tower_qdq artifact).")
    soc_model: int = Field(default=SNAPDRAGON_X_SOC_MODEL, ge=0, description="QNN SoC model id (60: Snapdragon X).")
    htp_arch: int = Field(default=SNAPDRAGON_X_HTP_ARCH, ge=68, description="Hexagon HTP architecture (73: v73).")
    verify: QnnVerify = Field(default_factory=QnnVerify, description="Verification thresholds and inputs.")
