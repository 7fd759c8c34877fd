"""Tiny checkpoints of the real architectures, generated deterministically.

No model hub is reachable from the machines this runs on, so the default
manifest and the tests build from checkpoints generated here. They are laid
out like the real ones: a Qwen3.5 VL checkpoint keeps its bf16 ``model.visual.*``
tensors in a shard shared with ``lm_head`` and ``embed_tokens``, with a second
shard, an index file and its ``Qwen2VLImageProcessor``'s
``preprocessor_config.json``; a SigLIP checkpoint has one ``model.safetensors``
with ``vision_model.*`` and ``text_model.*`` and a ``preprocessor_config.json``.

Tensor names and shapes come from instantiating transformers' own model
classes; values are then redrawn from a seeded generator at scales that make
the outputs (and so the verification numbers) meaningful, rather than the
near-zero activations of a 0.02-std init.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgebuild.core.atomic import new_directory
from edgebuild.errors import ManifestError

FIXTURE_FORMAT = 1

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


@dataclass(frozen=True)
class Fixture:
    name: str
    summary: str
    defaults: dict[str, Any]
    write: Callable[[Path, dict[str, Any], int], None]


# Fixtures exist to be generated in seconds: a size or count past this is not tiny
# (and 10**23 layers would never finish).
MAX_FIXTURE_INTEGER = 4096


def check_overrides(defaults: dict[str, Any], overrides: dict[str, Any], path: tuple[str, ...] = ()) -> None:
    """An override of a default must be of the default's type; integers (sizes and
    counts; token ids may be 0) within reason. New keys pass through to the config."""
    for key, value in overrides.items():
        where = " -> ".join(("fixture_config", *path, str(key)))
        if key not in defaults:
            continue
        default = defaults[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise ManifestError(f"{where}: expected a mapping, found {value!r}")
            check_overrides(default, value, (*path, str(key)))
        elif isinstance(default, int) and not isinstance(default, bool):
            minimum = 0 if str(key).endswith("_id") else 1
            if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= MAX_FIXTURE_INTEGER:
                raise ManifestError(f"{where}: expected an integer from {minimum} to {MAX_FIXTURE_INTEGER}, found {value!r}")
        elif type(value) is not type(default):
            raise ManifestError(f"{where}: expected a {type(default).__name__}, found {value!r}")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _redraw(state: dict[str, Any], seed: int, *, uneven_norms: bool = False) -> dict[str, Any]:
    """Deterministic values by role: weights ~ N(0, 1/fan_in), norms near 1, small biases.

    With ``uneven_norms`` LayerNorm scales span about two orders of magnitude,
    so that activation-aware equalization has something to balance.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    redrawn = {}
    for name in sorted(state):
        tensor = state[name]
        shape = tuple(tensor.shape)
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        is_norm = "norm" in name.lower()
        if is_norm and leaf == "weight":
            if uneven_norms:
                value = torch.exp2(noise.clamp(-3, 3) * 1.5)
            else:
                value = 1.0 + 0.2 * noise
        elif leaf == "bias" or is_norm:
            value = 0.05 * noise
        elif len(shape) >= 2:
            fan_in = 1
            for size in shape[1:]:
                fan_in *= size
            value = noise / (fan_in ** 0.5)
        else:
            value = 0.5 * noise
        redrawn[name] = value.to(tensor.dtype)
    return redrawn


def _write_qwen3_5_vl(directory: Path, config: dict[str, Any], seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    from transformers.initialization import no_init_weights

    model_config = Qwen3_5Config(**config)
    with no_init_weights():
        model = Qwen3_5ForConditionalGeneration(model_config)
    state = {name: tensor.to(torch.bfloat16) for name, tensor in model.state_dict().items()}
    state = _redraw(state, seed)
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


def _write_siglip(directory: Path, config: dict[str, Any], seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import SiglipConfig, SiglipModel
    from transformers.initialization import no_init_weights

    from edgebuild.ml.siglip import quiet_transformers

    with quiet_transformers():
        model_config = SiglipConfig(**config)
    with no_init_weights():
        model = SiglipModel(model_config)
    state = {name: tensor.to(torch.float32) for name, tensor in model.state_dict().items()}
    state = _redraw(state, seed, uneven_norms=True)
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


def _write_siglip_vision(directory: Path, config: dict[str, Any], seed: int) -> None:
    """The vision encoder of ``siglip_tiny`` (the same weights, for the same vision
    settings and seed) as transformers 5's ``SiglipVisionModel.save_pretrained`` lays it
    out: a SiglipVisionConfig ``config.json`` (no ``vision_config``) and tensors without
    the ``vision_model.`` prefix; with the same ``preprocessor_config.json``."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    from transformers import SiglipVisionConfig

    from edgebuild.ml.siglip import VISION_PREFIX, quiet_transformers

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


FIXTURES: dict[str, Fixture] = {
    fixture.name: fixture
    for fixture in (
        Fixture(
            "qwen3_5_vl_tiny",
            "Qwen3.5 VL (Qwen3_5ForConditionalGeneration), 2-block 64-wide vision tower, bf16, two shards + index",
            QWEN3_5_VL_TINY,
            _write_qwen3_5_vl,
        ),
        Fixture(
            "siglip_tiny",
            "SigLIP (SiglipModel), 2-layer 96-wide vision encoder, 64x64 images, uneven LayerNorm scales",
            SIGLIP_TINY,
            _write_siglip,
        ),
        Fixture(
            "qwen3_5_vl_tiny_fp8",
            "qwen3_5_vl_tiny as an FP8 release: float8_e4m3fn text weights with 128x128 scales, the tower bf16",
            QWEN3_5_VL_TINY,
            _write_qwen3_5_vl_fp8,
        ),
        Fixture(
            "siglip_vision_tiny",
            "siglip_tiny's vision encoder as SiglipVisionModel.save_pretrained writes it (no text tower)",
            SIGLIP_TINY["vision_config"],
            _write_siglip_vision,
        ),
    )
}


def fixture_directory(cache_dir: Path, name: str, overrides: dict[str, Any], seed: int = 0) -> Path:
    """The directory a fixture with these overrides lives in, keyed by everything that
    decides its bytes: the full config (defaults included), the seed, and this file's
    code. Two configurations never share a directory, and a changed generator never
    serves a stale one."""
    config = _merge(FIXTURES[name].defaults, overrides) if name in FIXTURES else overrides
    key = json.dumps(
        {
            "format": FIXTURE_FORMAT,
            "name": name,
            "config": config,
            "seed": seed,
            "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "fixtures" / f"{name}-{digest}"


def ensure_fixture(cache_dir: Path, name: str, overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """Generate the fixture unless it already exists; return its directory.

    Written into a temporary directory and renamed into place, so a reader
    never sees half a checkpoint, and two processes racing both end up with
    one complete copy.
    """
    overrides = overrides or {}
    if name not in FIXTURES:
        import difflib

        match = difflib.get_close_matches(name, list(FIXTURES), n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise ManifestError(f"fixture: unknown fixture {name!r}; expected one of {', '.join(map(repr, FIXTURES))}{hint}")
    check_overrides(FIXTURES[name].defaults, overrides)
    target = fixture_directory(cache_dir, name, overrides, seed)
    if target.is_dir():
        return target
    fixture = FIXTURES[name]
    with new_directory(target, target.parent / ".tmp", replace=False) as scratch:
        fixture.write(scratch, _merge(fixture.defaults, overrides), seed)
    return target


def write_fixture(directory: Path, name: str, overrides: dict[str, Any] | None = None, seed: int = 0) -> Path:
    """Write a fixture into ``directory`` (for tests and users who want a copy to edit)."""
    directory.mkdir(parents=True, exist_ok=True)
    FIXTURES[name].write(directory, _merge(FIXTURES[name].defaults, overrides or {}), seed)
    return directory
