"""The fused numba kernels give the torch formulations' results bit for bit.

`f143.project` (torch ops) is itself checked against the seed's arithmetic in
test_f143.py, and `gptq._gptq_quantize_batched` (torch ops, used off CPU)
against the seed's per-column GPTQ in test_gptq.py; here the kernels are
compared with those, on every float32 magnitude where F143 rounding does
anything and on weights of awkward shapes.
"""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest
import torch

from edgebuild.ml.quant import f143, gptq
from edgebuild.ml.quant import kernels as f143_kernels


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int32)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bit for bit, except that any NaN equals any NaN (the float8 cast leaves a payload bit)."""
    nan = torch.isnan(expected)
    return torch.equal(torch.isnan(actual), nan) and torch.equal(_bits(actual[~nan]), _bits(expected[~nan]))


def _kernel_project(values: torch.Tensor, exponent: int) -> torch.Tensor:
    matrix = values.reshape(1, -1)
    factors = f143.tile_factors(torch.full((1, 1), exponent))
    projected = np.empty(matrix.shape, np.float32)
    f143_kernels.project_tiles(matrix.numpy(), factors.numpy(), matrix.shape[1], projected, False)
    return torch.from_numpy(projected).reshape(values.shape)


@pytest.mark.slow
def test_projection_matches_torch_on_every_magnitude_that_rounds() -> None:
    """All float32 bit patterns from 2**-12 (below it everything rounds to zero) to 2**9
    (past 240 everything saturates): 176 M values, in both signs."""
    first = 0x39800000  # 2**-12
    last = 0x44000000  # 2**9
    chunk = 1 << 24
    for start in range(first, last, chunk):
        values = torch.arange(start, min(start + chunk, last), dtype=torch.int32).view(torch.float32)
        assert torch.equal(_bits(_kernel_project(values, 0)), _bits(f143.project(values)))
        negative = -values[::7]
        assert torch.equal(_bits(_kernel_project(negative, 0)), _bits(f143.project(negative)))


def test_projection_matches_torch_below_and_above_the_grid_and_with_scales() -> None:
    generator = torch.Generator().manual_seed(0)
    # Tiny magnitudes (float32 subnormals included), huge ones, and the specials.
    tiny = torch.randint(0, 0x39800000, (1 << 20,), generator=generator, dtype=torch.int32)
    huge = torch.randint(0x44000000, 0x7F800000, (1 << 20,), generator=generator, dtype=torch.int32)
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), f143.SEED_NAN_MAGNITUDE, 240.0, 248.0, 2.0**-11]
    )
    values = torch.cat([tiny.view(torch.float32), huge.view(torch.float32), specials])
    values = torch.cat([values, -values])
    for exponent in (-32, -7, -1, 0, 1, 5, 31):
        expected = f143.project(values, float(exponent))
        assert _same(_kernel_project(values, exponent), expected), exponent
    # Random weights at random scales: the grid points of every exponent.
    scaled = torch.randn(1 << 20, generator=generator) * torch.exp2(torch.randint(-40, 40, (1 << 20,), generator=generator))
    for exponent in (-32, -12, 0, 12, 31):
        assert _same(_kernel_project(scaled, exponent), f143.project(scaled, float(exponent)))


def _weight_with_tile_scales(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random weight whose 64x64 tiles span 2**-20 to 2**20, so every tile has its own exponent."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols, generator=generator)
    tiles = torch.randint(-20, 21, (-(-rows // 64), -(-cols // 64)), generator=generator)
    return weight * f143.expand_exponents(torch.exp2(tiles.float()), weight.shape)


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (70, 100), (300, 257), (64, 64), (513, 192)])
def test_project_tiles_and_helpers_match_torch(rows: int, cols: int) -> None:
    weight = _weight_with_tile_scales(rows, cols, seed=rows * cols)
    exponents = f143.tile_exponents(weight)
    padded = torch.nn.functional.pad(weight.abs(), (0, -cols % 64, 0, -rows % 64))
    torch_maxima = padded.reshape(-(-rows // 64), 64, -(-cols // 64), 64).amax(dim=(1, 3))
    assert torch.equal(f143._tile_abs_max(weight, 64), torch_maxima)
    expected = f143.project(weight, f143.expand_exponents(exponents, weight.shape))
    projected = f143.project_tiles(weight, exponents)
    assert torch.equal(_bits(projected), _bits(expected))
    assert torch.equal(_bits(f143.projection_residual(weight, exponents)), _bits(weight - expected))
    limits = f143.expand_exponents(240.0 * torch.exp2(exponents.float()), weight.shape)
    assert f143.saturated_count(projected, exponents) == int((projected.abs() == limits).sum())


@pytest.mark.parametrize(
    "call",
    [f143.project_tiles, f143.projection_residual, f143.off_grid_count, f143.saturated_count,
     lambda weight, exponents: f143.pack(weight, exponents=exponents)],
)
def test_kernel_callers_reject_exponents_of_the_wrong_shape(call) -> None:
    """The kernels index without bounds checks, so the shape is checked before them."""
    weight = f143.quantize_nearest(torch.randn(130, 130, generator=torch.Generator().manual_seed(1)))
    with pytest.raises(ValueError, match=r"exponents of shape \(1, 1\) do not tile a \(130, 130\) weight"):
        call(weight, torch.zeros(1, 1, dtype=torch.int32))


def test_tile_abs_max_keeps_nan_wherever_it_is_in_the_tile() -> None:
    weight = torch.rand(130, 130, generator=torch.Generator().manual_seed(2))
    for position in [(0, 0), (63, 63), (64, 0), (129, 129), (5, 100)]:
        poisoned = weight.clone()
        poisoned[position] = float("nan")
        maxima = f143._tile_abs_max(poisoned, 64)
        tile = (position[0] // 64, position[1] // 64)
        assert torch.isnan(maxima[tile]).item()
        assert int(torch.isnan(maxima).sum()) == 1
    with pytest.raises(ValueError, match="weight contains NaN"):
        f143.tile_exponents(poisoned)


def _factors(width: int, seed: int, damp: float = 0.01, samples: int = 200) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(samples, width, generator=generator) * torch.rand(width, generator=generator) * 3
    statistics = gptq.accumulate_block_hessians(gptq.empty_block_hessians(width), inputs)
    return gptq.inverse_hessian_factors(statistics.hessians, damp, width)


@pytest.mark.parametrize(
    ("rows", "cols", "damp", "samples"),
    # Shapes with a ragged last block or row tile, one over CHUNK_ROWS, and a
    # rank-deficient Hessian with no damping (the diagonal fallback).
    [(70, 100, 0.01, 200), (300, 257, 0.1, 300), (513, 64, 0.01, 100), (64, 128, 0.0, 20)],
)
@pytest.mark.slow
def test_gptq_kernel_matches_batched_torch(rows: int, cols: int, damp: float, samples: int) -> None:
    weight = _weight_with_tile_scales(rows, cols, seed=rows + cols)
    factors = _factors(cols, seed=cols, damp=damp, samples=samples)
    exponents = f143.tile_exponents(weight)
    divisors = torch.diagonal(factors, dim1=-2, dim2=-1).clamp_min(torch.finfo(torch.float32).eps)
    expected = gptq._gptq_quantize_batched(weight, factors, divisors, exponents, 64)
    quantized, residual = gptq._gptq_quantize_residual(weight, factors, exponents, 64)
    assert torch.equal(_bits(quantized), _bits(expected))
    assert torch.equal(_bits(residual), _bits(weight - expected))
    buffer = torch.full_like(weight, float("nan"))
    _, written = gptq._gptq_quantize_residual(weight, factors, exponents, 64, buffer)
    assert written is buffer and torch.equal(_bits(buffer), _bits(residual))
    assert torch.equal(_bits(gptq.gptq_quantize(weight, factors, exponents)), _bits(expected))


@pytest.mark.slow
def test_gptq_kernel_result_does_not_depend_on_thread_count() -> None:
    weight = _weight_with_tile_scales(600, 200, seed=1)
    factors = _factors(200, seed=2)
    exponents = f143.tile_exponents(weight)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = gptq.gptq_quantize(weight, factors, exponents)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(_bits(single), _bits(gptq.gptq_quantize(weight, factors, exponents)))


@pytest.mark.slow
def test_kernels_have_no_fused_multiply_add() -> None:
    """An FMA would round `w - e * f` once where torch rounds twice. Compiled afresh
    (numba cannot show the assembly of cached code), with the same options."""
    kernel = numba.njit(parallel=True)(f143_kernels.gptq_blocks.py_func)
    weight = np.zeros((70, 100), np.float32)
    kernel(weight, np.zeros((2, 64, 64), np.float32), np.ones((2, 64), np.float32),
           np.ones((2, 2), np.float32), np.empty_like(weight), np.empty_like(weight))
    assembly = "\n".join(kernel.inspect_asm().values())
    assert re.search(r"\bvsubps\b", assembly), "the update is expected to be vectorised"
    assert not re.search(r"\bv?f(n)?m(add|sub)\w*", assembly)
