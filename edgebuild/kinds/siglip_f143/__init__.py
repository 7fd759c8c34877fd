"""Kind ``siglip_f143``: a SigLIP vision encoder reconstructed onto the F143 grid.

The encoder's linear weights (q, k, v, out_proj, fc1, fc2 of each selected
layer) are quantized to F143 (``torch.float8_e4m3fnuz`` values) times one
power-of-two scale per 64x64 tile, by GPTQ over block-diagonal Hessians or by
nearest rounding; optionally with LayerNorm equalization, sequential layers and
bias correction. The numerics are ``edgebuild.quant`` (pure functions, identical
to the seed's algorithm). Here: ``params`` (the options), ``calibration`` (the
lifecycle), ``packed`` (the packed format), ``build`` and ``verify``.

Options the seed lacks, default off for parity: an identity candidate for
equalization (the seed's best alpha can be worse than not scaling), sorted
SafeTensors metadata (the seed's header order varies run to run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ParameterError
from ...siglip import VISION_PREFIX
from ..base import ArtifactKind, ArtifactParams, TensorSelection
from ..registry import register
from ..starter import Starter
from .packed import load_packed
from .params import MODEL_FILE, PACKED_FILE, REPORT_FILE, SiglipF143Params

if TYPE_CHECKING:
    from ...checkpoint import Checkpoint

__all__ = ["SiglipF143", "load_packed"]


@register
class SiglipF143(ArtifactKind):
    name = "siglip_f143"
    summary = "SigLIP vision encoder quantized to F143 (GPTQ) -> SafeTensors"
    Params = SiglipF143Params
    outputs = ("config.json", "preprocessor_config.json", MODEL_FILE, PACKED_FILE, REPORT_FILE)
    build_module = "edgebuild.kinds.siglip_f143.build"
    verify_module = "edgebuild.kinds.siglip_f143.verify"
    starter = Starter(
        checkpoints={"siglip": "siglip_tiny"},
        entry="""\
  # A SigLIP vision encoder whose linear weights are reconstructed onto F143 (FP8
  # E4M3, exponent bias 8) times a power-of-two scale per 64x64 tile.
  siglip_f143_gptq:
    kind: siglip_f143
    description: SigLIP vision encoder, GPTQ onto F143
    checkpoint: siglip
    calibration:
      images: [data/calibration/*.png]   # run through the checkpoint's image processor
    held_out:
      images: [data/held_out/*.png]      # verification only
    algorithm: gptq                      # gptq | nearest
    sorted_metadata: true                # the same bytes on every rebuild
    verify:
      cosine_min: 0.99                   # quantized vs float encoder, worst batch
""",
    )

    def tensor_selection(self, params: ArtifactParams) -> TensorSelection:
        return TensorSelection(prefixes=(VISION_PREFIX,), config_key="vision_config")

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, "Checkpoint"]) -> None:
        assert isinstance(params, SiglipF143Params)
        checkpoint = checkpoints[params.checkpoint]
        vision = checkpoint.config_section("vision_config")
        checkpoint.select((VISION_PREFIX,))
        available = vision.get("num_hidden_layers", 12)
        if isinstance(params.layers, int) and params.layers > available:
            raise ParameterError(
                f"{params.layers} is outside the model (vision_config.num_hidden_layers = {available})", key="layers"
            )
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ParameterError("'cuda' was requested but torch.cuda.is_available() is False", key="device")
