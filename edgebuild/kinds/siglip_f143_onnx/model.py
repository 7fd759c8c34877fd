"""The quantized encoder of a built ``siglip_f143`` directory, the module the graph
is exported from, and random pixels at the graph's size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgebuild.models.siglip.f143 import MODEL_FILE as SOURCE_MODEL_FILE
from edgebuild.models.siglip.f143 import REPORT_FILE as SOURCE_REPORT_FILE
from edgebuild.models.siglip.model import vision_settings
from edgebuild.plugin import CheckpointError

if TYPE_CHECKING:
    import torch


def load_quantized(source: Path) -> tuple[Any, dict[str, Any], list[str]]:
    """The quantized SiglipVisionModel from a built siglip_f143 directory, strictly."""
    from safetensors.torch import load_file
    from transformers import SiglipVisionConfig, SiglipVisionModel
    from transformers.initialization import no_init_weights

    # The source's config.json is its checkpoint's, copied: a SiglipConfig or a SiglipVisionConfig.
    vision = vision_settings(json.loads((source / "config.json").read_text()))
    with no_init_weights():
        model = SiglipVisionModel(SiglipVisionConfig(**vision))
    missing, unexpected = model.load_state_dict(load_file(str(source / SOURCE_MODEL_FILE)), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"{source / SOURCE_MODEL_FILE}: does not match SiglipVisionModel ({missing[:3]}, {unexpected[:3]})")
    quantized = json.loads((source / SOURCE_REPORT_FILE).read_text())["quantized_linears"]
    return model.eval(), vision, quantized


def encoder_class() -> type:
    import torch

    class Encoder(torch.nn.Module):
        """pixel_values -> last_hidden_state (and pooler_output when the model has a head)."""

        def __init__(self, model: Any, interpolate: bool) -> None:
            super().__init__()
            self.model = model
            self.interpolate = interpolate

        def forward(self, pixel_values: torch.Tensor) -> Any:
            output = self.model(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate)
            if output.pooler_output is None:
                return output.last_hidden_state
            return output.last_hidden_state, output.pooler_output

    return Encoder


def random_pixels(image_size: int, count: int, seed: int) -> list["torch.Tensor"]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    # SigLIP's processor maps pixels to [-1, 1].
    return [torch.rand(1, 3, image_size, image_size, generator=generator) * 2 - 1 for _ in range(count)]
