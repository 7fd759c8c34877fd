"""Kind ``ort_format``: an ONNX artifact's graph in onnxruntime's ORT format, for reduced
onnxruntime builds on phones (with the operators such a build must register)."""

from __future__ import annotations

from edgebuild.plugin import ArtifactKind, Starter

from .params import INFO_FILE, MODEL_FILE, OPERATORS_FILE, OrtFormatParams


class OrtFormat(ArtifactKind):
    name = "ort_format"
    summary = "an ONNX artifact's graph -> onnxruntime's ORT format (.ort)"
    Params = OrtFormatParams
    outputs = (MODEL_FILE, OPERATORS_FILE, INFO_FILE)
    build_module = "edgebuild.kinds.ort_format.build"
    verify_module = "edgebuild.kinds.ort_format.verify"
    source_kinds = ("hf_onnx", "qwen3_5_vision_tower", "onnx_qdq", "qwen3_5_tower_qdq", "siglip_f143_onnx")
    memory_factor = 2.0
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
