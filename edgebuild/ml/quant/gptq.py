"""Block-diagonal GPTQ onto the F143 grid, bias correction and LayerNorm equalization.

Pure functions, no I/O; loading models, hooks and saving are orchestration
and live elsewhere. Every result that the seed
(the SigLIP reconstruction script in `shared/seeds/`) produces is reproduced bit for bit
(weights, factors, Hessians, equalization scales); `tests/seed_reference.py`
restates the seed and the tests compare with `torch.equal`.

Why it is faster than the seed while staying exact: the Hessian is
block-diagonal over 64-column input blocks, so the blocks of one linear are
independent. The seed walks them one after the other, column by column;
here column `c` of every block is processed in the same elementwise ops.
The ops involved (+ - * /, abs, clamp, copysign, the float8 cast, exp2 of
integers) are exactly rounded, so batching changes the speed and nothing
else. That is not true of every elementwise op: torch's exp2 of arbitrary
floats differs between its vectorised and scalar paths, so new ops here need
the same check. Reductions and LAPACK calls are where batching could change
rounding; those were checked (batched inverse and Cholesky equal the
per-matrix calls) or stay per block (Hessian accumulation keeps one `addmm_`
per block: a batched `baddbmm` differed for short inputs). A fused
`addcmul_` was measured to differ (FMA) on some layouts, so the GPTQ update
keeps the seed's separate multiply and subtract.

On CPU the batched torch ops are still memory-bound (each of a block's 64
columns streams the whole weight through several ops); the fused numba
kernels in `edgebuild.ml.quant.kernels` do the same per-element arithmetic on one
cache-sized chunk at a time, and are used there.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import torch

from edgebuild.ml.quant import kernels as f143_kernels
from edgebuild.ml.quant.f143 import (
    TILE,
    kernel_operands,
    project,
    project_tiles,
    projection_residual,
    quantize_nearest,
    saturated_count,
    tile_exponents,
)

ALGORITHMS = ("gptq", "nearest")
DEFAULT_DAMP = 0.01
EQUALIZATION_ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_SCALE_LIMIT = 16.0
# Floors the seed uses: a zero RMS would make the scale 0 or inf.
RMS_FLOOR = 1e-8


def _block_count(width: int, block_size: int) -> int:
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return math.ceil(width / block_size)


class BlockHessians(NamedTuple):
    """Calibration statistics of one linear's input, accumulated batch by batch.

    `hessians` is [n_blocks, block, block] float32: X^T X of each 64-column
    input block, the last block zero-padded when the width is not a multiple
    of the block size. `input_sum` / `count` give the input mean for bias
    correction.
    """

    hessians: torch.Tensor
    input_sum: torch.Tensor
    count: int

    @property
    def in_features(self) -> int:
        return self.input_sum.shape[0]

    @property
    def block_size(self) -> int:
        return self.hessians.shape[-1]

    @property
    def input_mean(self) -> torch.Tensor:
        return self.input_sum / self.count


def empty_block_hessians(
    in_features: int, block_size: int = TILE, device: torch.device | str | None = None
) -> BlockHessians:
    """Zero statistics for a linear with `in_features` inputs."""
    blocks = _block_count(in_features, block_size)
    return BlockHessians(
        torch.zeros(blocks, block_size, block_size, device=device),
        torch.zeros(in_features, device=device),
        0,
    )


def accumulate_block_hessians(state: BlockHessians, inputs: torch.Tensor) -> BlockHessians:
    """Return `state` plus one batch of inputs (any leading shape, last dim = in_features).

    One `addmm_` per block into a copy, exactly as the seed's hook does: GEMM
    accumulates into its output panel by panel, so `H + X^T X` computed
    another way would round differently.
    """
    values = inputs.detach().to(torch.float32).reshape(-1, inputs.shape[-1])
    if values.shape[1] != state.in_features:
        raise ValueError(
            f"inputs have {values.shape[1]} features, statistics expect {state.in_features}"
        )
    hessians = state.hessians.clone()
    block_size = state.block_size
    for index, start in enumerate(range(0, state.in_features, block_size)):
        block = values[:, start : start + block_size]
        width = block.shape[1]
        hessians[index, :width, :width].addmm_(block.T, block)
    return BlockHessians(hessians, state.input_sum + values.sum(dim=0), state.count + values.shape[0])


def _last_block_width(in_features: int, block_size: int) -> int:
    return in_features - (_block_count(in_features, block_size) - 1) * block_size


def _factors_of_equal_blocks(hessians: torch.Tensor, damp: float) -> torch.Tensor:
    """Seed's inverse_hessian_factor over a batch of same-size blocks.

    Damping adds max(eps64, damp * mean(diag)) in float64; the upper
    Cholesky factor of the inverse is taken; a block whose inverse or
    Cholesky fails falls back to diag(H)^-1/2 (of the damped H).
    """
    damped = hessians.to(torch.float64)
    eps = torch.finfo(torch.float64).eps
    # Python floats, as in the seed (`max(eps, damp * mean.item())`).
    increments = [
        max(eps, damp * mean)
        for mean in torch.diagonal(damped, dim1=-2, dim2=-1).mean(dim=-1).tolist()
    ]
    diagonal = torch.diagonal(damped, dim1=-2, dim2=-1)
    diagonal.add_(torch.tensor(increments, dtype=torch.float64, device=damped.device)[:, None])
    inverse, inverse_info = torch.linalg.inv_ex(damped)
    factors, cholesky_info = torch.linalg.cholesky_ex(inverse, upper=True)
    failed = (inverse_info != 0) | (cholesky_info != 0)
    if failed.any():
        fallback = torch.diag_embed(torch.diagonal(damped, dim1=-2, dim2=-1).rsqrt())
        factors = torch.where(failed[:, None, None], fallback, factors)
    return factors.to(torch.float32)


def inverse_hessian_factors(
    hessians: torch.Tensor, damp: float = DEFAULT_DAMP, in_features: int | None = None
) -> torch.Tensor:
    """Upper Cholesky factors of each block's damped inverse Hessian, [n_blocks, b, b] float32.

    `in_features` tells how wide the zero-padded last block really is (the
    damping mean runs over its real diagonal only); its factor is embedded in
    an identity so that the padded columns of a batched GPTQ stay inert.
    """
    if damp < 0.0:
        raise ValueError(f"damp must be non-negative, got {damp}")
    blocks, block_size, _ = hessians.shape
    if in_features is None:
        in_features = blocks * block_size
    if _block_count(in_features, block_size) != blocks:
        raise ValueError(
            f"{blocks} Hessian blocks of {block_size} do not cover {in_features} inputs"
        )
    last = _last_block_width(in_features, block_size)
    if last == block_size:
        return _factors_of_equal_blocks(hessians, damp)
    factors = torch.eye(block_size, device=hessians.device).repeat(blocks, 1, 1)
    factors[:-1] = _factors_of_equal_blocks(hessians[:-1], damp)
    factors[-1, :last, :last] = _factors_of_equal_blocks(
        hessians[-1:, :last, :last].contiguous(), damp
    )[0]
    return factors


def gptq_quantize(
    weight: torch.Tensor,
    factors: torch.Tensor,
    exponents: torch.Tensor,
    block_size: int = TILE,
) -> torch.Tensor:
    """GPTQ every column block of `weight` at once; float32 result, the seed's gptq_block per block.

    `factors` comes from `inverse_hessian_factors` (identity-padded last
    block), `exponents` from `tile_exponents(weight, block_size)` (the scales
    are fixed from the original weight, before any error feedback). Error
    feedback can push a value past 240 * 2**e; it is saturated there, as in
    the seed.

    On CPU this runs `f143_kernels.gptq_blocks` (fused, cache-blocked; 5-7x
    faster on so400m's linears); elsewhere the batched torch ops. Both give
    the same bits.
    """
    rows, width = weight.shape
    blocks = _block_count(width, block_size)
    if tuple(factors.shape) != (blocks, block_size, block_size):
        raise ValueError(
            f"factors of shape {tuple(factors.shape)} do not match a width of {width} "
            f"in blocks of {block_size}"
        )
    if tuple(exponents.shape) != (math.ceil(rows / block_size), blocks):
        raise ValueError(
            f"exponents of shape {tuple(exponents.shape)} do not tile a {rows}x{width} "
            f"weight in blocks of {block_size}"
        )
    return _gptq_quantize_residual(weight, factors, exponents, block_size)[0]


def _gptq_quantize_residual(
    weight: torch.Tensor,
    factors: torch.Tensor,
    exponents: torch.Tensor,
    block_size: int,
    residual: torch.Tensor | None = None,
    quantized: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`gptq_quantize` and `weight - quantized` (float32), which the CPU kernel gives in one pass.

    `residual` and `quantized`, float32 tensors of the weight's shape, are written
    over and returned when given (the CPU kernel writes into them): reusing a buffer
    saves a page fault per 4 KiB, which on fresh tens of MB costs as much as the
    kernel itself, and a destination that is the output file's page needs no copy.
    """
    eps = torch.finfo(torch.float32).eps
    # Each block's diagonal entry: what the column's error is divided by.
    divisors = torch.diagonal(factors, dim1=-2, dim2=-1).clamp_min(eps)
    if weight.device.type != "cpu":
        values = weight.detach().to(torch.float32)
        quantized = _gptq_quantize_batched(values, factors, divisors, exponents, block_size)
        return quantized, values - quantized
    values, scales = kernel_operands(weight, exponents)
    quantized = _float32_buffer(quantized, values, "quantized")
    residual = _float32_buffer(residual, values, "residual")
    f143_kernels.gptq_blocks(
        values.numpy(),
        factors.detach().to(torch.float32).contiguous().numpy(),
        divisors.contiguous().numpy(),
        scales,
        quantized.numpy(),
        residual.numpy(),
    )
    return quantized, residual


def _float32_buffer(buffer: torch.Tensor | None, like: torch.Tensor, what: str) -> torch.Tensor:
    """`buffer`, checked to be what a kernel may write `like`'s result into; a new one if None."""
    if buffer is None:
        return torch.empty_like(like)
    if buffer.shape != like.shape or buffer.dtype != torch.float32 or not buffer.is_contiguous():
        raise ValueError(f"{what} buffer must be contiguous float32 {tuple(like.shape)}")
    return buffer


def _gptq_quantize_batched(
    weight: torch.Tensor,
    factors: torch.Tensor,
    divisors: torch.Tensor,
    exponents: torch.Tensor,
    block_size: int,
) -> torch.Tensor:
    """The same GPTQ as torch ops, column `c` of every block in one op (any device).

    The working copy is laid out [block column, block, row]: weight rows
    are the innermost, contiguous dimension, so each step's update is long
    vectorised runs with one factor entry broadcast along them (3x faster
    than keeping blocks innermost, measured on a 1152x4304 weight).
    """
    rows, width = weight.shape
    blocks = factors.shape[0]
    padded = torch.nn.functional.pad(weight.to(torch.float32), (0, blocks * block_size - width))
    working = padded.reshape(rows, blocks, block_size).permute(2, 1, 0).contiguous()
    # [blocks, rows]: the exponent of every weight row within every block.
    row_exponents = (
        exponents.to(torch.float32).repeat_interleave(block_size, dim=0)[:rows].T.contiguous()
    )
    # [column, blocks, 1]: each block's divisor, broadcast along rows.
    column_divisors = divisors.T[:, :, None]
    # [column, later column, blocks, 1]: factor row `column` of every block.
    spread = factors.permute(1, 2, 0).contiguous()[:, :, :, None]
    output = torch.empty_like(working)
    # One scratch buffer for the error products: allocating tens of MB per
    # column costs page faults that showed up as multi-second stalls here.
    products = torch.empty_like(working[1:])
    for column in range(block_size):
        current = working[column]
        quantized = project(current, row_exponents)
        output[column] = quantized
        later = block_size - column - 1
        if later:
            error = (current - quantized) / column_divisors[column]
            torch.mul(error, spread[column, column + 1 :], out=products[:later])
            working[column + 1 :].sub_(products[:later])
    return output.permute(2, 1, 0).reshape(rows, blocks * block_size)[:, :width]


class Reconstruction(NamedTuple):
    """A reconstructed weight and its Hessian-weighted errors: sum over blocks of e H e^T.

    `residual` is the float32 original minus the reconstructed weight, what
    `bias_correction` multiplies by the mean input; `saturated` counts the
    weights that sit at their tile's largest magnitude, 240 * 2**e.
    """

    weight: torch.Tensor
    nearest_objective: float
    reconstructed_objective: float
    residual: torch.Tensor
    saturated: int


def _weighted_error(error: torch.Tensor, hessians: torch.Tensor, block_size: int) -> float:
    """Seed's objective, sum over blocks of sum((E_b @ H_b) * E_b), as sum(H_b * E_b^T E_b).

    The same quantity, with the Gram matrices of all blocks in one einsum
    (3x faster than a matmul per block). It is a report value, not a weight:
    its rounding differs from the seed's in the last bits (tests compare to 1e-6).
    """
    rows, width = error.shape
    blocks = hessians.shape[0]
    padded = error.to(torch.float32)
    if width != blocks * block_size:
        padded = torch.nn.functional.pad(padded, (0, blocks * block_size - width))
    per_block = padded.reshape(rows, blocks, block_size)
    grams = torch.einsum("rbi,rbj->bij", per_block, per_block)
    return torch.sum(grams * hessians, dtype=torch.float64).item()


def reconstruct(
    weight: torch.Tensor,
    hessians: torch.Tensor,
    damp: float = DEFAULT_DAMP,
    algorithm: str = "gptq",
    block_size: int = TILE,
    out: torch.Tensor | None = None,
) -> Reconstruction:
    """Quantize one linear's weight onto F143 with `algorithm` ("gptq" or "nearest").

    `hessians` is `BlockHessians.hessians` for this linear's input. The
    weight comes back in its own dtype, as the seed writes it in place.
    `out`, a tensor of the weight's dtype and shape, receives it and is
    returned as `Reconstruction.weight` (it may be the weight itself); a float32
    GPTQ on CPU is written there by the kernel itself, with no copy of its own
    made first.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if out is not None and (out.dtype != weight.dtype or out.shape != weight.shape):
        raise ValueError(f"out is {out.dtype} {tuple(out.shape)}, the weight {weight.dtype} {tuple(weight.shape)}")
    rows, width = weight.shape
    blocks = _block_count(width, block_size)
    if tuple(hessians.shape) != (blocks, block_size, block_size):
        raise ValueError(
            f"Hessians of shape {tuple(hessians.shape)} do not match a width of {width} "
            f"in blocks of {block_size}"
        )
    exponents = tile_exponents(weight, block_size)
    if algorithm == "gptq":
        residual = projection_residual(weight, exponents, block_size)
        nearest_objective = _weighted_error(residual, hessians, block_size)
        factors = inverse_hessian_factors(hessians, damp, width)
        # The nearest residual is done with: its buffer takes GPTQ's.
        # Not into the weight's own memory: the kernel reads the weight while it writes.
        direct = out if (weight.dtype == torch.float32 and out is not None and out.is_contiguous()
                         and out.untyped_storage().data_ptr() != weight.untyped_storage().data_ptr()) else None
        rebuilt, residual = _gptq_quantize_residual(weight, factors, exponents, block_size, residual, direct)
        rebuilt_objective = _weighted_error(residual, hessians, block_size)
    else:
        rebuilt = project_tiles(weight, exponents, block_size)
        residual = weight.to(torch.float32) - rebuilt
        nearest_objective = rebuilt_objective = _weighted_error(residual, hessians, block_size)
    stored = rebuilt.to(weight.dtype)
    if stored.dtype != torch.float32:
        # The seed's W - Wq uses the weight as stored (float16 cannot hold every scale).
        residual = weight.to(torch.float32) - stored.to(torch.float32)
    saturated = saturated_count(rebuilt, exponents, block_size)
    if out is not None and stored is not out:
        stored = out.copy_(stored)
    return Reconstruction(stored, nearest_objective, rebuilt_objective, residual, saturated)


def bias_correction(residual: torch.Tensor, input_mean: torch.Tensor) -> torch.Tensor:
    """What to add to the bias so the mean input gives the same output: (W - Wq) @ mean(x).

    `residual` is W - Wq in float32 (`Reconstruction.residual`), as the seed
    computes it: `original.float() - quantized.float()`.
    """
    return residual @ input_mean


class EqualizationChoice(NamedTuple):
    """The chosen per-channel scale; `alpha` is None for the identity candidate."""

    alpha: float | None
    scale: torch.Tensor
    objective: float
    baseline: float


def equalization_scale(
    activation_rms: torch.Tensor, weight_rms: torch.Tensor, alpha: float, scale_limit: float
) -> torch.Tensor:
    """act_rms^alpha / w_rms^(1-alpha), normalised by sqrt(min * max), clamped to [1/limit, limit]."""
    scale = activation_rms.pow(alpha) / weight_rms.pow(1.0 - alpha)
    scale /= (scale.min() * scale.max()).sqrt()
    return scale.clamp_(1.0 / scale_limit, scale_limit)


def equalization_objective(
    weights: Sequence[torch.Tensor],
    second_moment: torch.Tensor,
    scale: torch.Tensor,
    block_size: int = TILE,
) -> float:
    """Activation-weighted nearest-F143 error of the consumers after scaling their inputs.

    With inputs divided by `scale` the second moment becomes E[x^2] / scale^2,
    which weights the error of each scaled weight column.
    """
    objective = 0.0
    for weight in weights:
        transformed = weight.to(torch.float32) * scale
        error = transformed - quantize_nearest(transformed, block_size)
        objective += torch.sum(error.square() * (second_moment / scale.square())).item()
    return objective


def choose_equalization_scale(
    weights: Sequence[torch.Tensor],
    second_moment: torch.Tensor,
    block_size: int = TILE,
    scale_limit: float = DEFAULT_SCALE_LIMIT,
    alphas: Sequence[float] = EQUALIZATION_ALPHAS,
    include_identity: bool = False,
) -> EqualizationChoice:
    """Pick the scale for a LayerNorm's consumers that minimises the weighted error.

    `weights` are the consumers' weights (they share the input), and
    `second_moment` is the mean of x^2 per input channel. `baseline` is the
    objective without any scale. The seed tries only the alphas, so even
    its best alpha can be worse than not scaling at all;
    `include_identity=True` adds scale = 1 as a candidate (first, so a tie
    keeps the weights unchanged) and then never does worse than baseline.
    """
    if scale_limit < 1.0:
        raise ValueError(f"scale_limit must be at least 1, got {scale_limit}")
    if not alphas and not include_identity:
        raise ValueError("no equalization candidate: give alphas or include_identity")
    activation_rms = second_moment.sqrt().clamp_min(RMS_FLOOR)
    stacked = torch.cat([weight.to(torch.float32) for weight in weights])
    weight_rms = stacked.square().mean(dim=0).sqrt().clamp_min(RMS_FLOOR)
    identity = torch.ones_like(second_moment)
    # Scaling by ones changes no value, so this equals the seed's baseline sum.
    baseline = equalization_objective(weights, second_moment, identity, block_size)
    candidates: list[tuple[float, float | None, torch.Tensor]] = []
    if include_identity:
        candidates.append((baseline, None, identity))
    for alpha in alphas:
        scale = equalization_scale(activation_rms, weight_rms, alpha, scale_limit)
        candidates.append(
            (equalization_objective(weights, second_moment, scale, block_size), alpha, scale)
        )
    objective, alpha, scale = min(candidates, key=lambda candidate: candidate[0])
    return EqualizationChoice(alpha, scale, objective, baseline)


def fold_scale(
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    consumer_weights: Sequence[torch.Tensor],
    scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Fold `scale` into a LayerNorm and its consumers without changing the network's output.

    LayerNorm output is divided by `scale` per channel and every consumer's
    input column multiplied by it (each tensor keeps its dtype).
    """
    return (
        norm_weight / scale.to(norm_weight.dtype),
        norm_bias / scale.to(norm_bias.dtype),
        [weight * scale.to(weight.dtype) for weight in consumer_weights],
    )
