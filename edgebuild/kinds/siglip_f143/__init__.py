"""Kind ``siglip_f143``: a SigLIP vision encoder reconstructed onto the F143 grid.

The encoder's linear weights (q, k, v, out_proj, fc1, fc2 of each selected
layer) are quantized to F143 (``torch.float8_e4m3fnuz`` values) times one
power-of-two scale per 64x64 tile, by GPTQ over block-diagonal Hessians or by
nearest rounding; optionally with LayerNorm equalization, sequential layers and
bias correction. The numerics are ``edgebuild.ml.quant`` (pure functions, identical
to the seed's algorithm). Here: ``params`` (the options), ``calibration`` (the
lifecycle), ``packed`` (the packed format), ``build`` and ``verify``.

Options the seed lacks, default off for parity: an identity candidate for
equalization (the seed's best alpha can be worse than not scaling), sorted
SafeTensors metadata (the seed's header order varies run to run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.models.hf import TRANSFORMERS_IMPORTS
from edgebuild.models.sample_images import starter_samples
from edgebuild.models.siglip.f143 import F143_ENCODER
from edgebuild.models.siglip.fixtures import FIXTURES
from edgebuild.models.siglip.model import PREPROCESSOR_FILE, siglip_layout
from edgebuild.plugin import ArtifactKind, Checkpoint, ParameterError, Plots, Process, Starter, TensorSelection

from .packed import load_packed
from .params import MODEL_FILE, PACKED_FILE, REPORT_FILE, SiglipF143Params

__all__ = ["SiglipF143", "load_packed"]


class SiglipF143(ArtifactKind[SiglipF143Params]):
    name = "siglip_f143"
    summary = "SigLIP vision encoder quantized to F143 (GPTQ) -> SafeTensors"
    Params = SiglipF143Params
    outputs = ("config.json", "preprocessor_config.json", MODEL_FILE, PACKED_FILE, REPORT_FILE)
    step = "quantization"
    produces = (F143_ENCODER,)
    build_module = "edgebuild.kinds.siglip_f143.build"
    verify_module = "edgebuild.kinds.siglip_f143.verify"
    # SigLIP-so400m-shaped GPTQ: 2.91 GiB peak for 1.6 GiB of float32 weights, baseline included.
    process = Process(memory_factor=2.0, worker_imports=TRANSFORMERS_IMPORTS)
    # Calibration images are what GPTQ fitted; the held-out ones say how it generalises.
    headline_check = "held_out.cosine"
    fixtures = FIXTURES
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
      images: [data/held_out/*.png]      # measured too, never calibrated on
    algorithm: gptq                      # gptq | nearest
    sorted_metadata: true                # the header's tensor entries sorted too
    verify:
      cosine_min: 0.99                   # quantized vs float encoder, worst batch
""",
        samples=starter_samples(),
    )

    def tensor_selection(self, params: SiglipF143Params, checkpoint: Checkpoint) -> TensorSelection:
        # The encoder's tensors, named as the checkpoint's layout names them (with or
        # without ``vision_model.``); all of config.json in every layout (the model is
        # built from its vision settings, and the file is copied into the artifact);
        # and the image processor that makes the calibration inputs (also copied).
        layout = siglip_layout(checkpoint)
        return TensorSelection(prefixes=(layout.prefix,), config_key=None, files=(PREPROCESSOR_FILE,))

    def check_parameters(self, params: SiglipF143Params, checkpoints: dict[str, Checkpoint]) -> None:
        checkpoint = checkpoints[params.checkpoint]
        layout = siglip_layout(checkpoint)
        checkpoint.select((layout.prefix,))
        available = checkpoint.config_int(layout.config_section, "num_hidden_layers", default=12, minimum=1)
        if isinstance(params.layers, int) and params.layers > available:
            where = "num_hidden_layers" if layout.config_section is None else f"{layout.config_section}.num_hidden_layers"
            raise ParameterError(f"{params.layers} is outside the model ({where} = {available})", key="layers")
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ParameterError("'cuda' was requested but torch.cuda.is_available() is False", key="device")

    def report_figures(self, name: str, directory: Path, report: dict[str, Any], uid: str) -> Plots:
        from .figures import siglip_figures

        return siglip_figures(name, directory, report, uid)
