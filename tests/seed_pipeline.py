"""The seed's whole reconstruction script, restated plainly for the tests and the
benchmark: every full forward pass it makes (references, equalization moments,
equalization metrics, Hessians -- once per layer with sequential layers --, final
metrics), hooks on the whole model, the per-column numerics of ``seed_reference``.

Deliberately slow and simple: it is what edgebuild's ``siglip_f143`` kind must
reproduce weight for weight.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

import seed_reference as seed

LINEAR_SUFFIXES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "mlp.fc1",
    "mlp.fc2",
)


@dataclass
class SeedOptions:
    algorithm: str = "gptq"
    block_size: int = 64
    damp: float = 0.01
    bias_correction: bool = True
    sequential_layers: bool = False
    equalize_layernorm: bool = False
    equalization_scale_limit: float = 16.0
    layers: int | None = None


@dataclass
class SeedResult:
    state: dict[str, torch.Tensor]
    objectives: dict[str, dict[str, float]] = field(default_factory=dict)
    equalization: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    forward_passes: int = 0


def _forward(model: Any, batches: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [model(pixel_values=pixels, interpolate_pos_encoding=False).last_hidden_state.clone() for pixels in batches]


def _linears(model: Any, layers: int) -> dict[str, torch.nn.Linear]:
    selected = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.startswith("encoder.layers."):
            if int(name.split(".")[2]) < layers and name.endswith(LINEAR_SUFFIXES):
                selected[name] = module
    return selected


def _collect(model: Any, modules: dict[str, Any], batches: list[torch.Tensor], block_size: int) -> dict[str, Any]:
    """One full forward with the seed's hooks: per-block X^T X (one addmm per batch and
    block), input sums, squared-input sums and counts, accumulated as the batches pass."""
    stats: dict[str, dict[str, Any]] = {}
    hooks = []
    for name, module in modules.items():
        width = module.in_features
        stats[name] = {
            "hessians": [torch.zeros((min(block_size, width - start),) * 2) for start in range(0, width, block_size)],
            "sum": torch.zeros(width),
            "square_sum": torch.zeros(width),
            "count": 0,
        }

        def hook(_module, args, name=name):
            values = args[0].detach().float().reshape(-1, args[0].shape[-1])
            entry = stats[name]
            entry["sum"].add_(values.sum(dim=0))
            entry["square_sum"].add_(values.square().sum(dim=0))
            entry["count"] += values.shape[0]
            for index, start in enumerate(range(0, values.shape[1], block_size)):
                block = values[:, start : start + block_size]
                entry["hessians"][index].addmm_(block.T, block)

        hooks.append(module.register_forward_pre_hook(hook))
    with torch.inference_mode():
        for pixels in batches:
            model(pixel_values=pixels, interpolate_pos_encoding=False)
    for handle in hooks:
        handle.remove()
    return stats


def run_seed(model: Any, batches: list[torch.Tensor], options: SeedOptions) -> SeedResult:
    """Quantize ``model`` in place as the seed does; return its state dict and report."""
    result = SeedResult(state={})
    layers = options.layers or model.config.num_hidden_layers
    modules = _linears(model, layers)
    started = time.perf_counter()
    _forward(model, batches)  # the references
    result.forward_passes += 1
    if options.equalize_layernorm:
        groups = []
        for index, layer in enumerate(model.encoder.layers[:layers]):
            attention = layer.self_attn
            groups.append((f"encoder_layer_{index:02}.norm1_qkv", layer.layer_norm1, [attention.q_proj, attention.k_proj, attention.v_proj]))
            groups.append((f"encoder_layer_{index:02}.norm2_fc1", layer.layer_norm2, [layer.mlp.fc1]))
        stats = _collect(model, {name: consumers[0] for name, _, consumers in groups}, batches, options.block_size)
        result.forward_passes += 1
        with torch.no_grad():
            for name, norm, consumers in groups:
                moment = stats[name]["square_sum"] / stats[name]["count"]
                alpha, scale, objective, baseline = seed.choose_equalization(
                    [consumer.weight for consumer in consumers], moment, options.block_size, options.equalization_scale_limit
                )
                norm.weight.div_(scale.to(norm.weight.dtype))
                norm.bias.div_(scale.to(norm.bias.dtype))
                for consumer in consumers:
                    consumer.weight.mul_(scale.to(consumer.weight.dtype))
                result.equalization[name] = {"alpha": alpha, "objective_ratio": objective / baseline if baseline else 0.0}
    _forward(model, batches)  # the equalization metrics (a copy of the references without equalization)
    result.forward_passes += 1
    result.timings["passes_before_reconstruction_s"] = time.perf_counter() - started

    reconstruction = 0.0
    collection_started = time.perf_counter()
    layer_groups = (
        [{name: module for name, module in modules.items() if name.startswith(f"encoder.layers.{layer}.")} for layer in range(layers)]
        if options.sequential_layers
        else [modules]
    )
    for group in layer_groups:
        stats = _collect(model, group, batches, options.block_size)
        result.forward_passes += 1
        with torch.no_grad():
            for name, module in group.items():
                started = time.perf_counter()
                hessians = stats[name]["hessians"]
                original = module.weight.detach().clone()
                rebuilt, nearest, reconstructed = seed.reconstruct_linear(
                    original, hessians, options.block_size, options.damp, options.algorithm
                )
                if options.bias_correction and module.bias is not None:
                    mean = stats[name]["sum"] / stats[name]["count"]
                    module.bias.add_(seed.bias_correction(original, rebuilt, mean).to(module.bias.dtype))
                module.weight.copy_(rebuilt)
                reconstruction += time.perf_counter() - started
                result.objectives[name] = {"nearest": nearest, "reconstructed": reconstructed}
    result.timings["reconstruction_s"] = reconstruction
    result.timings["collection_s"] = time.perf_counter() - collection_started - reconstruction
    _forward(model, batches)  # the final metrics
    result.forward_passes += 1
    result.state = {name: value.detach().clone() for name, value in model.state_dict().items()}
    return result
