"""Kind ``ort_format``: an ONNX artifact's graph in onnxruntime's ORT format, for reduced
onnxruntime builds on phones (with the operators such a build must register)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import ArtifactKind, Process, Starter
from edgebuild.targets.formats import ONNX_GRAPH

from .params import INFO_FILE, MODEL_FILE, OPERATORS_FILE, OrtFormatParams


class OrtFormat(ArtifactKind[OrtFormatParams]):
    name = "ort_format"
    summary = "an ONNX artifact's graph -> onnxruntime's ORT format (.ort)"
    Params = OrtFormatParams
    outputs = (MODEL_FILE, OPERATORS_FILE, INFO_FILE)
    consumes = (ONNX_GRAPH,)
    build_module = "edgebuild.kinds.ort_format.build"
    verify_module = "edgebuild.kinds.ort_format.verify"
    process = Process(memory_factor=2.0, quiet_loggers=("ort_format_model",))
    # The source's graph in another file format: a QDQ source's error is the ORT file's.
    exact_conversion = True
    starter = Starter(
        entry="""\
  # The ONNX graph above in onnxruntime's ORT format, for a reduced onnxruntime build on a
  # phone (with the operators it must register).
  clip_64_ort:
    kind: ort_format
    description: the CLIP graph in the ORT format
    source: clip_64
""",
    )

    def consumer_programs(self, params: OrtFormatParams, out_dir: Path, sources: dict[str, Path]) -> dict[str, Any]:
        # In the build module, so that its code is in the fingerprint.
        from .build import program_signature

        return {MODEL_FILE: program_signature(out_dir / MODEL_FILE)}
