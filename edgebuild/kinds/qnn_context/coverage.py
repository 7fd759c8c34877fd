"""Where the QNN execution provider placed the graph when it compiled it (``context.json``):
the ``qnn_htp`` coverage certificate of the :data:`QNN_CONTEXT` this kind writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.core.kind import CoverageTarget, Format
from edgebuild.targets.formats import ONNX_OP_TYPES
from edgebuild.targets.coverage import Certificate

from .params import CONTEXT_BINARY_FILE, INFO_FILE, MODEL_FILE, PROVIDER


def placement_certificate(info: dict[str, Any], provider: str = PROVIDER) -> Certificate:
    """The QNN execution provider's placement of the session's graph (``context.json`` of a
    build): the real provider on the HTP backend, at the SoC's architecture."""
    parts = info.get("partitions", [])
    fallbacks = [{"node": None, "op_type": op, "module": None}
                 for part in parts if part["provider"] != provider
                 for op, count in sorted(part.get("ops", {}).items()) for _ in range(int(count))]
    return Certificate(
        target="qnn_htp", tool=f"onnxruntime-qnn ({provider}), QNN SDK {info.get('qnn_sdk', 'unknown')}",
        tool_version=str(info.get("onnxruntime_qnn", "unknown")),
        assumption=f"soc_model {info.get('soc_model')}, HTP v{info.get('htp_arch')}; the session's graph after "
                   "onnxruntime's rewrites, CPU fallback disabled",
        nodes_total=int(info["nodes_on_qnn"]) + int(info["nodes_elsewhere"]), nodes_taken=int(info["nodes_on_qnn"]),
        partitions=sum(1 for part in parts if part["provider"] == provider), fallbacks=fallbacks,
    )


def qnn_htp(directory: Path, memo: dict[str, Any]) -> Certificate:
    return placement_certificate(read_json(directory / INFO_FILE, RECORD_BYTES))


QNN_HTP = CoverageTarget("qnn_htp", "the QNN HTP backend (the provider's placement at compile time)",
                         f"{__name__}:qnn_htp", vocabulary="ONNX op types", op_types=ONNX_OP_TYPES)
QNN_CONTEXT = Format("qnn_context", "a QNN HTP context",
                     (MODEL_FILE, CONTEXT_BINARY_FILE, INFO_FILE), certificates=(QNN_HTP,))
