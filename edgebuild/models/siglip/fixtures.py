"""Tiny generated SigLIP checkpoints, laid out like the real releases: one
``model.safetensors`` with ``vision_model.*`` and ``text_model.*`` and a
``preprocessor_config.json``, or the vision encoder alone as
``SiglipVisionModel.save_pretrained`` writes it. Tensor names and shapes come from
transformers' own model classes; values are redrawn from a seeded generator.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgebuild.core.fixtures import redraw_weights
from edgebuild.core.kind import Fixture
from edgebuild.models.siglip.model import VISION_PREFIX, quiet_transformers

SIGLIP_TINY: dict[str, Any] = {
    "vision_config": {
        # Widths that are not multiples of 64 exercise the padded edge tiles.
        "hidden_size": 96,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 64,
        "patch_size": 8,
    },
    "text_config": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "vocab_size": 128,
        "max_position_embeddings": 16,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 1,
    },
}


def _write_siglip(directory: Path, config: dict[str, Any], seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import SiglipConfig, SiglipModel
    from transformers.initialization import no_init_weights

    with quiet_transformers():
        model_config = SiglipConfig(**config)
    with no_init_weights():
        model = SiglipModel(model_config)
    state = {name: tensor.to(torch.float32) for name, tensor in model.state_dict().items()}
    state = redraw_weights(state, seed, uneven_norms=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config_dict = model_config.to_dict()
    config_dict.pop("transformers_version", None)
    config_dict["architectures"] = ["SiglipModel"]
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    size = model_config.vision_config.image_size
    with quiet_transformers():
        # Resolved inside: without torchvision the name falls back to the PIL processor, with a warning.
        from transformers import SiglipImageProcessor

        processor = SiglipImageProcessor(size={"height": size, "width": size})
        processor.save_pretrained(str(directory))


def _write_siglip_vision(directory: Path, config: dict[str, Any], seed: int) -> None:
    """The vision encoder of ``siglip_tiny`` (the same weights, for the same vision
    settings and seed) as transformers 5's ``SiglipVisionModel.save_pretrained`` lays it
    out: a SiglipVisionConfig ``config.json`` (no ``vision_config``) and tensors without
    the ``vision_model.`` prefix; with the same ``preprocessor_config.json``."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import SiglipVisionConfig

    _write_siglip(directory, {"vision_config": config, "text_config": SIGLIP_TINY["text_config"]}, seed)
    weights = directory / "model.safetensors"
    with safe_open(str(weights), framework="pt") as source:
        state = {
            name.removeprefix(VISION_PREFIX): source.get_tensor(name).clone()
            for name in source.keys() if name.startswith(VISION_PREFIX)
        }
    scratch = directory / ".model.safetensors.tmp"
    save_file(dict(sorted(state.items())), str(scratch), metadata={"format": "pt"})
    scratch.replace(weights)
    with quiet_transformers():
        # The keys save_pretrained writes: those that differ from PretrainedConfig's defaults.
        vision = SiglipVisionConfig(**config).to_diff_dict()
    vision.pop("transformers_version", None)
    vision["architectures"] = ["SiglipVisionModel"]
    (directory / "config.json").write_text(json.dumps(vision, indent=2, sort_keys=True) + "\n")



FIXTURES = (
    Fixture(
        "siglip_tiny",
        "SigLIP (SiglipModel), 2-layer 96-wide vision encoder, 64x64 images, uneven LayerNorm scales",
        SIGLIP_TINY,
        _write_siglip,
    ),
    Fixture(
        "siglip_vision_tiny",
        "siglip_tiny's vision encoder as SiglipVisionModel.save_pretrained writes it (no text tower)",
        SIGLIP_TINY["vision_config"],
        _write_siglip_vision,
    ),
)
