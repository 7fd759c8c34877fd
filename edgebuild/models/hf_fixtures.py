"""Tiny generated checkpoints of common Hugging Face encoders, as ``save_pretrained``
lays them out: ``config.json``, ``model.safetensors`` and the model's own
preprocessor (``preprocessor_config.json``).

- ``clip_vision_tiny``: a ``CLIPVisionModel`` (64x64 images, patch 8) with its
  ``CLIPImageProcessor``;
- ``dinov2_tiny``: a ``Dinov2Model`` (64x64 images, patch 8) with its ``BitImageProcessor``;
- ``wav2vec2_tiny``: a ``Wav2Vec2Model`` (16 kHz audio, two convolutions) with its
  ``Wav2Vec2FeatureExtractor``;
- ``distilbert_tiny``: a ``DistilBertForSequenceClassification`` (two labels, named) with
  its tokenizer (``tokenizer.json``: a WordPiece vocabulary of a few dozen English words
  and the letters).

Tensor names and shapes come from instantiating transformers' own classes; values
are redrawn from a seeded generator (``redraw_weights``), so two machines write the
same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgebuild.core.fixtures import redraw_weights
from edgebuild.core.kind import Fixture
from edgebuild.models.hf import quiet_transformers

CLIP_VISION_TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 64,
    "patch_size": 8,
    "projection_dim": 32,
}
DINOV2_TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "image_size": 64,
    "patch_size": 8,
}
WAV2VEC2_TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "conv_dim": [32, 32],
    "conv_stride": [5, 2],
    "conv_kernel": [10, 3],
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
    "num_feat_extract_layers": 2,
    "vocab_size": 32,
}


# A vocabulary small enough to read, large enough that a sentence of common words is not
# all [UNK]: special tokens, words, letters and their continuations, punctuation.
_WORDS = ("a an and at bad big blue by car cat day dog fast fine for from good great green house in is it night of "
          "on photo picture red sky slow small that the this to tree was with").split()
DISTILBERT_VOCAB = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_WORDS, *"abcdefghijklmnopqrstuvwxyz",
                    *(f"##{letter}" for letter in "abcdefghijklmnopqrstuvwxyz"), *".,!?'")
DISTILBERT_TINY: dict[str, Any] = {
    "dim": 64,
    "hidden_dim": 128,
    "n_layers": 2,
    "n_heads": 4,
    "vocab_size": len(DISTILBERT_VOCAB),
    "max_position_embeddings": 64,
    "id2label": {"0": "negative", "1": "positive"},
    "label2id": {"negative": 0, "positive": 1},
}


def _write_model(directory: Path, config: Any, model_class: Any, architecture: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = model_class(config)
    state = {name: tensor.to(torch.float32) for name, tensor in model.state_dict().items()}
    state = redraw_weights(state, seed)
    save_file({name: value.contiguous() for name, value in sorted(state.items())}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    config_dict = config.to_diff_dict()
    config_dict.pop("transformers_version", None)
    config_dict["architectures"] = [architecture]
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")


def _save_processor(directory: Path, processor: Any, names: tuple[str, ...] = ("preprocessor_config.json",)) -> None:
    """The processor (or tokenizer) saved as transformers saves it, the JSON files of
    ``names`` rewritten with their keys sorted (the same bytes from every transformers
    that writes the same content)."""
    processor.save_pretrained(str(directory))
    for name in names:
        path = directory / name
        if path.is_file():
            path.write_text(json.dumps(json.loads(path.read_text()), indent=2, sort_keys=True) + "\n")


def _write_clip_vision(directory: Path, config: dict[str, Any], seed: int) -> None:
    # Importing an image processor without torchvision prints a remark a user generating a
    # fixture need not read (it falls back to the PIL processor, which is what we want).
    with quiet_transformers():
        from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    _write_model(directory, CLIPVisionConfig(**config), CLIPVisionModel, "CLIPVisionModel", seed)
    size = config["image_size"]
    _save_processor(directory, CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}))


def _write_dinov2(directory: Path, config: dict[str, Any], seed: int) -> None:
    with quiet_transformers():  # as above
        from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    _write_model(directory, Dinov2Config(**config), Dinov2Model, "Dinov2Model", seed)
    size = config["image_size"]
    _save_processor(directory, BitImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}, do_center_crop=True,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    ))


def _write_wav2vec2(directory: Path, config: dict[str, Any], seed: int) -> None:
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    _write_model(directory, Wav2Vec2Config(**config), Wav2Vec2Model, "Wav2Vec2Model", seed)
    _save_processor(directory, Wav2Vec2FeatureExtractor(sampling_rate=16000, do_normalize=True))


def _write_distilbert(directory: Path, config: dict[str, Any], seed: int) -> None:
    with quiet_transformers():
        from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertTokenizerFast

    _write_model(directory, DistilBertConfig(**config), DistilBertForSequenceClassification,
                 "DistilBertForSequenceClassification", seed)
    tokenizer = DistilBertTokenizerFast(vocab={token: index for index, token in enumerate(DISTILBERT_VOCAB)},
                                        do_lower_case=True)
    _save_processor(directory, tokenizer, ("tokenizer.json", "tokenizer_config.json"))


FIXTURES = (
    Fixture("clip_vision_tiny", "CLIP vision encoder (CLIPVisionModel), 2 layers, 64-wide, 64x64 images, with its "
            "CLIPImageProcessor", CLIP_VISION_TINY, _write_clip_vision),
    Fixture("dinov2_tiny", "DINOv2 (Dinov2Model), 2 layers, 64-wide, 64x64 images, with its BitImageProcessor",
            DINOV2_TINY, _write_dinov2),
    Fixture("wav2vec2_tiny", "wav2vec 2.0 encoder (Wav2Vec2Model), 2 layers, 64-wide, 16 kHz audio, with its "
            "Wav2Vec2FeatureExtractor", WAV2VEC2_TINY, _write_wav2vec2),
    Fixture("distilbert_tiny", "DistilBERT text classifier (DistilBertForSequenceClassification), 2 layers, 64-wide, "
            "2 named labels, with its tokenizer", DISTILBERT_TINY, _write_distilbert),
)
