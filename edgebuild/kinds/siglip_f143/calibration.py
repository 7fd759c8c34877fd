"""The calibration lifecycle of a SigLIP encoder: reference pass, optional LayerNorm
equalization, reconstruction of every selected linear (all at once, or layer by
layer on cached hidden states), each step returning typed results.

The seed runs the calibration set through the whole model four times
(references, equalization metrics, Hessians, final metrics) and, with
``sequential_layers``, once more per layer. Here the reference pass also
collects the Hessians (or, with equalization, the second moments), the
equalization-metrics pass also collects the Hessians, and sequential layers run
one layer at a time on cached hidden states. The activations are the same
tensors through the same kernels, so the weights are identical. The numerics
are ``edgebuild.ml.quant`` (pure); this module only moves tensors between them
and the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.ml.compare import compare_outputs
from edgebuild.models.siglip.model import encoder_outputs
from edgebuild.plugin import Phases
from .params import LINEAR_SUFFIXES, SiglipF143Params

if TYPE_CHECKING:
    import torch

Log = Callable[[str], None]
# Where a linear's reconstructed weight is written and kept: its name -> a tensor of
# the weight's dtype and shape (its place in the output file), which the module then holds.
Destination = Callable[[str], Any]


@dataclass(frozen=True)
class LinearResult:
    """One reconstructed linear: its activation-weighted error before (nearest
    rounding) and after reconstruction, its bias correction, its clamped weights."""

    nearest: float
    reconstructed: float
    bias_correction_rms: float
    saturated: int

    @property
    def ratio(self) -> float:
        return self.reconstructed / self.nearest if self.nearest else 0.0

    def to_json(self) -> dict[str, float]:
        return {"nearest": self.nearest, "reconstructed": self.reconstructed, "ratio": self.ratio,
                "bias_correction_rms": self.bias_correction_rms}


@dataclass(frozen=True)
class EqualizationResult:
    """The scale folded into one LayerNorm and its consumers."""

    alpha: float
    objective_ratio: float
    scale_minimum: float
    scale_maximum: float


@dataclass
class CalibrationResult:
    references: list["torch.Tensor"]
    held_out_references: list["torch.Tensor"]
    linears: dict[str, LinearResult] = field(default_factory=dict)
    equalization: dict[str, EqualizationResult] = field(default_factory=dict)
    equalization_metrics: list[dict[str, float]] = field(default_factory=list)
    forward_passes: int = 0

    def objective_ratio(self) -> float:
        """Reconstructed over nearest objective, summed over every linear."""
        nearest = sum(result.nearest for result in self.linears.values())
        return sum(result.reconstructed for result in self.linears.values()) / nearest if nearest else 0.0


def encoder_linears(model: Any, layer_count: int) -> dict[str, Any]:
    """The quantized linears, in module order: ``encoder.layers.{i}.{suffix}`` for i < layer_count."""
    import torch

    selected = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and _is_encoder_linear(name):
            if int(name.split(".")[2]) < layer_count:
                selected[name] = module
    return selected


def is_linear_weight(name: str) -> bool:
    """Whether ``name`` (a ``SiglipVisionModel`` parameter) is the weight of an encoder
    linear this kind may quantize: the calibration swaps such a weight for a new tensor
    (``_reconstruct``, ``_equalize``) and never writes into it, so it is loaded as a view
    of the checkpoint instead of a copy (``load_vision_model``'s ``replaced``)."""
    return name.endswith(".weight") and _is_encoder_linear(name.removesuffix(".weight"))


def _is_encoder_linear(name: str) -> bool:
    return name.startswith("encoder.layers.") and name.endswith(LINEAR_SUFFIXES)


def layernorm_groups(model: Any, layer_count: int) -> list[tuple[str, Any, list[Any]]]:
    """``(name, LayerNorm, consumers)`` for ``layer_norm1 -> q, k, v`` and ``layer_norm2 -> fc1``."""
    groups = []
    for index, layer in enumerate(model.encoder.layers[:layer_count]):
        attention = layer.self_attn
        groups.append((f"encoder_layer_{index:02}.norm1_qkv", layer.layer_norm1, [attention.q_proj, attention.k_proj, attention.v_proj]))
        groups.append((f"encoder_layer_{index:02}.norm2_fc1", layer.layer_norm2, [layer.mlp.fc1]))
    return groups


class Collector:
    """Forward pre-hooks that accumulate block Hessians and/or second moments.

    Linears fed the very same tensor (``q_proj``, ``k_proj`` and ``v_proj`` all read
    ``layer_norm1``'s output) have the same Hessians: they start from one shared zero
    state, and a linear whose input and state are those the previous hook just
    accumulated takes that result instead of computing it again. The statistics are
    never modified in place (each accumulation returns new ones), so sharing them is
    safe, and they are the tensors the seed's three hooks compute, bit for bit.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.hessians: dict[str, Any] = {}
        self.moments: dict[str, list[Any]] = {}
        self._hooks: list[Any] = []
        # (input tensor, its version, the state it was added to, the result) of the last hook.
        self._last: tuple[Any, int | None, Any, Any] | None = None

    def hessians_of(self, modules: dict[str, Any]) -> "Collector":
        from edgebuild.ml.quant.gptq import empty_block_hessians

        empty: dict[tuple[int, Any], Any] = {}
        for name, module in modules.items():
            start = (module.in_features, module.weight.device)
            if start not in empty:
                empty[start] = empty_block_hessians(module.in_features, self.block_size, module.weight.device)
            self.hessians[name] = empty[start]

            def hook(_module: Any, inputs: tuple[Any, ...], name: str = name) -> None:
                self.hessians[name] = self._accumulated(self.hessians[name], inputs[0])

            self._hooks.append(module.register_forward_pre_hook(hook))
        return self

    def _accumulated(self, state: Any, tensor: Any) -> Any:
        from edgebuild.ml.quant.gptq import accumulate_block_hessians

        last = self._last
        version = _version(tensor)
        if last is not None and last[0] is tensor and last[1] == version and last[2] is state:
            return last[3]
        values = tensor.detach().float().reshape(-1, tensor.shape[-1])
        result = accumulate_block_hessians(state, values)
        self._last = (tensor, version, state, result)
        return result

    def moments_of(self, modules: dict[str, Any]) -> "Collector":
        import torch

        for name, module in modules.items():
            self.moments[name] = [torch.zeros(module.in_features, device=module.weight.device), 0]

            def hook(_module: Any, inputs: tuple[Any, ...], name: str = name) -> None:
                values = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
                self.moments[name][0].add_(values.square().sum(dim=0))
                self.moments[name][1] += values.shape[0]

            self._hooks.append(module.register_forward_pre_hook(hook))
        return self

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        self._last = None


def _version(tensor: Any) -> int | None:
    """The tensor's in-place version counter; ``None`` for an inference-mode tensor, which
    has none (the encoder's forward writes no input in place between its linears)."""
    return None if tensor.is_inference() else tensor._version


def calibrate(
    model: Any,
    modules: dict[str, Any],
    batches: list["torch.Tensor"],
    held_out: list["torch.Tensor"],
    params: SiglipF143Params,
    layer_count: int,
    device: Any,
    phases: Phases,
    log: Log,
    destination: Destination | None = None,
) -> CalibrationResult:
    """Quantize ``modules`` of ``model`` in place; return what was measured on the way.

    ``destination(name)``, where given, is the tensor linear ``name``'s reconstructed
    weight is written into (its place in the output file) and the module then holds."""
    groups = layernorm_groups(model, layer_count) if params.equalize_layernorm else []
    collect_now = not params.equalize_layernorm and not params.sequential_layers

    # Pass 1: the float model's outputs, and whatever statistics its activations give.
    with phases.time("reference_pass"):
        collector = Collector(params.block_size)
        if collect_now:
            collector.hessians_of(modules)
        if groups:
            collector.moments_of({name: consumers[0] for name, _norm, consumers in groups})
        result = CalibrationResult(references=encoder_outputs(model, batches, device), held_out_references=[])
        result.forward_passes += 1
        collector.close()
        result.held_out_references = encoder_outputs(model, held_out, device)

    if groups:
        with phases.time("equalization"):
            result.equalization = _equalize(groups, collector, params, log)
            # Pass 2: the equalized model (its metrics), collecting the Hessians on the way.
            collector = Collector(params.block_size)
            if not params.sequential_layers:
                collector.hessians_of(modules)
            equalized = encoder_outputs(model, batches, device)
            result.forward_passes += 1
            collector.close()
            result.equalization_metrics = [
                compare_outputs(reference, output) for reference, output in zip(result.references, equalized)
            ]

    if params.sequential_layers:
        hidden = _embed(model, batches, device)
        for layer in range(layer_count):
            marker = f"encoder.layers.{layer}."
            layer_modules = {name: module for name, module in modules.items() if name.startswith(marker)}
            with phases.time("collection"):
                collector = Collector(params.block_size).hessians_of(layer_modules)
                _run_layer(model, layer, hidden)
                collector.close()
            with phases.time("reconstruction"):
                result.linears |= _reconstruct(layer_modules, collector, params, len(result.linears), len(modules),
                                               log, destination)
            with phases.time("collection"):
                hidden = _run_layer(model, layer, hidden)
        result.forward_passes += 1
    else:
        with phases.time("reconstruction"):
            result.linears = _reconstruct(modules, collector, params, 0, len(modules), log, destination)
    return result


def _equalize(groups: list[tuple[str, Any, list[Any]]], collector: Collector, params: SiglipF143Params,
              log: Log) -> dict[str, EqualizationResult]:
    import torch

    from edgebuild.ml.quant import gptq

    chosen = {}
    with torch.no_grad():
        for name, norm, consumers in groups:
            total, count = collector.moments.pop(name)
            choice = gptq.choose_equalization_scale(
                [consumer.weight for consumer in consumers],
                total / count,
                params.block_size,
                params.equalization_scale_limit,
                include_identity=params.equalization_identity_candidate,
            )
            norm_weight, norm_bias, weights = gptq.fold_scale(
                norm.weight, norm.bias, [consumer.weight for consumer in consumers], choice.scale
            )
            norm.weight.copy_(norm_weight)
            norm.bias.copy_(norm_bias)
            for consumer, weight in zip(consumers, weights):
                consumer.weight.data = weight  # a swap, as in _reconstruct
            chosen[name] = EqualizationResult(
                alpha=choice.alpha,
                objective_ratio=choice.objective / choice.baseline if choice.baseline else 0.0,
                scale_minimum=choice.scale.min().item(),
                scale_maximum=choice.scale.max().item(),
            )
            log(f"equalized {name}: alpha {choice.alpha}, objective {chosen[name].objective_ratio:.4f}x")
    return chosen


def _embed(model: Any, batches: list[Any], device: Any) -> list[Any]:
    import torch

    with torch.inference_mode():
        return [model.embeddings(pixels.to(device), interpolate_pos_encoding=False) for pixels in batches]


def _run_layer(model: Any, layer: int, hidden: list[Any]) -> list[Any]:
    """One encoder layer on cached inputs, called as ``SiglipEncoder.forward`` calls it."""
    import torch

    with torch.inference_mode():
        return [model.encoder.layers[layer](state, None) for state in hidden]


def _reconstruct(modules: dict[str, Any], collector: Collector, params: SiglipF143Params, done: int, total: int,
                 log: Log, destination: Destination | None = None) -> dict[str, LinearResult]:
    import torch

    from edgebuild.ml.quant import gptq

    results = {}
    with torch.no_grad():
        for name, module in modules.items():
            statistics = collector.hessians.pop(name)
            result = gptq.reconstruct(
                module.weight.detach(), statistics.hessians, params.damp, params.algorithm, params.block_size,
                out=destination(name) if destination is not None else None,
            )
            correction = torch.zeros(module.out_features, device=module.weight.device)
            if params.bias_correction and module.bias is not None:
                correction = gptq.bias_correction(result.residual, statistics.input_mean)
                module.bias.add_(correction.to(module.bias.dtype))
            # float8 has no -0: store +0.0 (before the final pass), so that the packed
            # form round-trips bit for bit and the outputs come from these weights.
            # Swap the storage rather than copy into it: the loaded weight is a view of
            # the checkpoint (``is_linear_weight``). With a destination, the new one is
            # a view of the output file.
            module.weight.data = result.weight.add_(0.0)
            results[name] = LinearResult(
                nearest=result.nearest_objective,
                reconstructed=result.reconstructed_objective,
                bias_correction_rms=correction.square().mean().sqrt().item(),
                saturated=result.saturated,
            )
            log(f"[{done + len(results)}/{total}] reconstructed {name} (weighted error {results[name].ratio:.4f}x)")
    return results
