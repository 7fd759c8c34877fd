"""A SigLIP vision encoder on the F143 grid as files another kind reads. The format
(:data:`F143_ENCODER`) is its ``config.json``, the float weights exactly on the grid
(``model.safetensors``), their packed form (``model.f143.safetensors``: FP8 codes and
tile exponents) and ``quantization.json`` (the options, which linears were quantized)."""

from __future__ import annotations

from edgebuild.core.kind import Format

MODEL_FILE = "model.safetensors"
PACKED_FILE = "model.f143.safetensors"
REPORT_FILE = "quantization.json"
F143_ENCODER = Format("siglip_f143_encoder", "a SigLIP encoder on the F143 grid",
                      ("config.json", MODEL_FILE, PACKED_FILE, REPORT_FILE))
