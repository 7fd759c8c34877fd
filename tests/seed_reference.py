"""Plain, per-column and per-block reference of the seed's F143/GPTQ numerics.

The seed (`seeds/siglip_f143_reconstruct.seed.py`) is the behaviour the
project must reproduce bit for bit. This module restates its numerics as
directly as possible: one column block at a time, one column at a time, with
the same floating-point operations in the same order, so that any faster
implementation in `edgebuild.ml.quant.f143` / `edgebuild.ml.quant.gptq` can be checked against
it with `torch.equal`. It is used by the tests and by benchmarks only; it is
deliberately slow and simple.
"""

from __future__ import annotations

import math

import torch


def project_f143(values: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Round `values / 2**scale` to F143 (arithmetic, ties to even), times 2**scale.

    Subnormals live on a uniform 2**-10 grid below 2**-7; normals keep three
    mantissa bits; everything is saturated at 240. The result keeps the
    sign of the input through copysign (so negative inputs that round to zero
    become -0.0) and the input's dtype.
    """
    dtype = values.dtype
    values = values.float()
    factor = torch.exp2(torch.as_tensor(-scale, device=values.device, dtype=torch.float32))
    magnitude = values.abs() * factor
    subnormal = torch.round(magnitude * 1024.0).clamp(max=8.0) * 2.0**-10
    exponent = torch.floor(torch.log2(magnitude.clamp_min(torch.finfo(torch.float32).tiny)))
    mantissa = torch.round((magnitude / torch.exp2(exponent) - 1.0) * 8.0)
    carry = mantissa == 8.0
    exponent += carry
    mantissa = torch.where(carry, torch.zeros_like(mantissa), mantissa)
    normal = (1.0 + mantissa / 8.0) * torch.exp2(exponent)
    projected = torch.where(magnitude < 2.0**-7, subnormal, normal).clamp(max=240.0)
    return torch.copysign(projected / factor, values).to(dtype)


def f143_scales_by_row_block(values: torch.Tensor, block_size: int) -> torch.Tensor:
    """Per-row exponent of one column block: one exponent per `block_size` rows."""
    rows = values.shape[0]
    padded = math.ceil(rows / block_size) * block_size
    if padded != rows:
        values = torch.nn.functional.pad(values, (0, 0, 0, padded - rows))
    maximum = values.abs().reshape(-1, block_size, values.shape[1]).amax(dim=(1, 2))
    exponents = torch.where(
        maximum == 0.0,
        torch.zeros_like(maximum),
        torch.ceil(torch.log2(maximum / 240.0)),
    ).clamp(-32.0, 31.0)
    return exponents.repeat_interleave(block_size)[:rows]


def inverse_hessian_factor(hessian: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of the damped inverse Hessian (float64 maths, float32 out)."""
    hessian = hessian.double()
    mean = torch.diagonal(hessian).mean()
    hessian.diagonal().add_(max(torch.finfo(torch.float64).eps, damp * mean.item()))
    try:
        return torch.linalg.cholesky(torch.linalg.inv(hessian), upper=True).float()
    except torch.linalg.LinAlgError:
        return torch.diag(torch.diagonal(hessian).rsqrt()).float()


def gptq_block(
    weight: torch.Tensor, inverse_factor: torch.Tensor, scales: torch.Tensor
) -> torch.Tensor:
    """Quantize one column block column by column, pushing each error rightwards."""
    working = weight.float().clone()
    output = torch.empty_like(working)
    for column in range(working.shape[1]):
        quantized = project_f143(working[:, column], scales)
        output[:, column] = quantized
        divisor = inverse_factor[column, column].clamp_min(torch.finfo(torch.float32).eps)
        error = (working[:, column] - quantized) / divisor
        working[:, column:].sub_(error[:, None] * inverse_factor[column, column:][None, :])
    return output


def nearest_f143_weight(weight: torch.Tensor, block_size: int) -> torch.Tensor:
    """Project every tile of `weight` onto its own scaled F143 grid."""
    output = torch.empty_like(weight)
    for start in range(0, weight.shape[1], block_size):
        block = weight[:, start : start + block_size]
        scales = f143_scales_by_row_block(block, block_size)
        output[:, start : start + block_size] = project_f143(block, scales[:, None])
    return output


def block_hessians(inputs: list[torch.Tensor], block_size: int) -> list[torch.Tensor]:
    """Per-column-block X^T X, accumulated batch by batch with addmm like the seed's hook."""
    width = inputs[0].shape[-1]
    hessians = [
        torch.zeros((min(block_size, width - start),) * 2)
        for start in range(0, width, block_size)
    ]
    for batch in inputs:
        values = batch.float().reshape(-1, width)
        for index, start in enumerate(range(0, width, block_size)):
            block = values[:, start : start + block_size]
            hessians[index].addmm_(block.T, block)
    return hessians


def reconstruct_linear(
    weight: torch.Tensor,
    hessians: list[torch.Tensor],
    block_size: int,
    damp: float,
    algorithm: str,
) -> tuple[torch.Tensor, float, float]:
    """The seed's per-linear loop: (reconstructed weight, nearest objective, rebuilt objective)."""
    reconstructed = torch.empty_like(weight)
    nearest_objective = 0.0
    rebuilt_objective = 0.0
    for index, start in enumerate(range(0, weight.shape[1], block_size)):
        end = min(start + block_size, weight.shape[1])
        hessian = hessians[index]
        block = weight[:, start:end]
        scales = f143_scales_by_row_block(block, block_size)
        nearest = project_f143(block, scales[:, None])
        if algorithm == "gptq":
            rebuilt = gptq_block(block, inverse_hessian_factor(hessian, damp), scales)
        else:
            rebuilt = nearest
        reconstructed[:, start:end] = rebuilt
        nearest_error = block.float() - nearest
        rebuilt_error = block.float() - rebuilt
        nearest_objective += torch.sum((nearest_error @ hessian) * nearest_error).item()
        rebuilt_objective += torch.sum((rebuilt_error @ hessian) * rebuilt_error).item()
    return reconstructed, nearest_objective, rebuilt_objective


def bias_correction(
    original: torch.Tensor, reconstructed: torch.Tensor, input_mean: torch.Tensor
) -> torch.Tensor:
    """Output shift that the weight change causes on the mean input."""
    return (original.float() - reconstructed.float()) @ input_mean


def choose_equalization(
    weights: list[torch.Tensor],
    second_moment: torch.Tensor,
    block_size: int,
    scale_limit: float,
) -> tuple[float, torch.Tensor, float, float]:
    """The seed's alpha search: (alpha, scale, objective, baseline); no identity candidate."""
    activation_rms = second_moment.sqrt().clamp_min(1e-8)
    weight_rms = torch.cat(weights).float().square().mean(dim=0).sqrt().clamp_min(1e-8)
    baseline = 0.0
    candidates = []
    for alpha in (0.0, 0.25, 0.5, 0.75, 1.0):
        scale = activation_rms.pow(alpha) / weight_rms.pow(1.0 - alpha)
        scale /= (scale.min() * scale.max()).sqrt()
        scale.clamp_(1.0 / scale_limit, scale_limit)
        objective = 0.0
        for weight in weights:
            transformed = weight.float() * scale
            error = transformed - nearest_f143_weight(transformed, block_size)
            objective += torch.sum(error.square() * (second_moment / scale.square())).item()
            if alpha == 0.0:
                unscaled = weight.float() - nearest_f143_weight(weight.float(), block_size)
                baseline += torch.sum(unscaled.square() * second_moment).item()
        candidates.append((objective, alpha, scale))
    objective, alpha, scale = min(candidates, key=lambda candidate: candidate[0])
    return alpha, scale, objective, baseline
