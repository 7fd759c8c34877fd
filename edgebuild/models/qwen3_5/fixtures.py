"""Tiny generated Qwen3.5 VL checkpoints, laid out like the real releases.

A Qwen3.5 VL checkpoint keeps its bf16 ``model.visual.*`` tensors in a shard shared
with ``lm_head`` and ``embed_tokens``, with a second shard, an index file and its
``Qwen2VLImageProcessor``'s ``preprocessor_config.json``; its FP8 release stores the
text decoder's linear weights as float8 blocks and the tower unchanged. Tensor names
and shapes come from instantiating transformers' own model classes; values are then
redrawn from a seeded generator (``redraw_weights``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgebuild.core.fixtures import redraw_weights
from edgebuild.core.kind import Fixture

QWEN3_5_VL_TINY: dict[str, Any] = {
    "vision_config": {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 4,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 96,
        "num_position_embeddings": 64,
    },
    "text_config": {
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "vocab_size": 512,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    },
}

def _write_qwen3_5_vl(directory: Path, config: dict[str, Any], seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.initialization import no_init_weights

    model_config = Qwen3_5Config(**config)
    with no_init_weights():
        model = Qwen3_5ForConditionalGeneration(model_config)
    state = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    state = redraw_weights(state, seed)
    # The real checkpoints share one shard between the tower, lm_head and the
    # embeddings; the decoder layers live elsewhere.
    shared = {
        name: tensor
        for name, tensor in state.items()
        if name.startswith("model.visual.")
        or name in ("lm_head.weight", "model.language_model.embed_tokens.weight")
    }
    rest = {name: tensor for name, tensor in state.items() if name not in shared}
    shards = {
        "model-00001-of-00002.safetensors": shared,
        "model-00002-of-00002.safetensors": rest,
    }
    weight_map = {}
    total = 0
    for filename, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / filename), metadata={"format": "pt"})
        for name, tensor in tensors.items():
            weight_map[name] = filename
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config_dict = model_config.to_dict()
    config_dict.pop("transformers_version", None)
    config_dict["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    # The image processor the real checkpoints ship: patches of the vision tower's
    # geometry, pixels normalised to [-1, 1], and the real pixel budget.
    vision = model_config.vision_config
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen3VLProcessor",
        "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "merge_size": vision.spatial_merge_size,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2, sort_keys=True) + "\n")


# The FP8 releases of Qwen3.5 quantize the text decoder's linear weights in 128x128
# blocks to float8_e4m3fn, whose largest value is 448, and keep one float32
# ``weight_scale_inv`` per block (the weight is the float8 value times it).
FP8_BLOCK = 128
FLOAT8_E4M3FN_MAX = 448.0
FP8_TEXT_PREFIX = "model.language_model.layers."


def _write_qwen3_5_vl_fp8(directory: Path, config: dict[str, Any], seed: int) -> None:
    """``qwen3_5_vl_tiny`` as its FP8 release stores it: the decoder layers' linear
    weights float8_e4m3fn with ``weight_scale_inv`` blocks, a ``quantization_config``
    whose ``modules_to_not_convert`` lists the vision tower's modules (and lm_head), and
    every ``model.visual.*`` tensor and ``vision_config`` exactly as in the plain one."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    _write_qwen3_5_vl(directory, config, seed)
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    weight_map: dict[str, str] = {}
    not_converted = ["lm_head"]
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(directory / shard), framework="pt") as source:
            # Copies: the shard is replaced below, and a mapping must not outlive its file.
            tensors = {name: source.get_tensor(name).clone() for name in source.keys()}
        stored = {}
        for name in sorted(tensors):
            tensor = tensors[name]
            if name.startswith(FP8_TEXT_PREFIX) and tensor.ndim == 2:
                stored[name], stored[name + "_scale_inv"] = _float8_blocks(tensor)
            else:
                stored[name] = tensor
                if name.startswith("model.visual.") and name.endswith(".weight") and tensor.ndim >= 2:
                    not_converted.append(name.removesuffix(".weight"))
        scratch = directory / f".{shard}.tmp"
        save_file({name: value.contiguous() for name, value in stored.items()}, str(scratch), metadata={"format": "pt"})
        scratch.replace(directory / shard)
        for name, tensor in stored.items():
            weight_map[name] = shard
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    index_path.write_text(json.dumps(index, indent=2) + "\n")
    config_path = directory / "config.json"
    config_dict = json.loads(config_path.read_text())
    config_dict["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        "modules_to_not_convert": sorted(not_converted),
    }
    config_path.write_text(json.dumps(config_dict, indent=2, sort_keys=True) + "\n")


def _float8_blocks(weight: Any) -> tuple[Any, Any]:
    """``weight`` as float8_e4m3fn values and one float32 scale per 128x128 block (edges
    padded), each block's largest magnitude mapped to 448."""
    import torch

    rows, cols = weight.shape
    row_blocks, col_blocks = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    padded = torch.zeros(row_blocks * FP8_BLOCK, col_blocks * FP8_BLOCK)
    padded[:rows, :cols] = weight.float()
    blocks = padded.view(row_blocks, FP8_BLOCK, col_blocks, FP8_BLOCK)
    largest = blocks.abs().amax(dim=(1, 3))
    scale_inv = torch.where(largest > 0, largest / FLOAT8_E4M3FN_MAX, torch.ones_like(largest))
    values = (blocks / scale_inv[:, None, :, None]).clamp(-FLOAT8_E4M3FN_MAX, FLOAT8_E4M3FN_MAX)
    codes = values.to(torch.float8_e4m3fn).view(row_blocks * FP8_BLOCK, col_blocks * FP8_BLOCK)[:rows, :cols]
    return codes.contiguous(), scale_inv



FIXTURES = (
    Fixture(
        "qwen3_5_vl_tiny",
        "Qwen3.5 VL (Qwen3_5ForConditionalGeneration), 2-block 64-wide vision tower, bf16, two shards + index",
        QWEN3_5_VL_TINY,
        _write_qwen3_5_vl,
    ),
    Fixture(
        "qwen3_5_vl_tiny_fp8",
        "qwen3_5_vl_tiny as an FP8 release: float8_e4m3fn text weights with 128x128 scales, the tower bf16",
        QWEN3_5_VL_TINY,
        _write_qwen3_5_vl_fp8,
    ),
)
