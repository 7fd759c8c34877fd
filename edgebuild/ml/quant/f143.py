"""F143: the FP8 grid that SigLIP weights are stored on, with power-of-two tile scales.

F143 is 1 sign, 4 exponent and 3 mantissa bits with exponent bias 8 and no
infinities: largest value 240, smallest normal 2**-7, smallest subnormal
2**-10. That is exactly `torch.float8_e4m3fnuz` (and ONNX FLOAT8E4M3FNUZ).
A weight is stored as codes in that format times one scale `2**e` per
64x64 tile (rows = output features, cols = input features, edges padded).

Every function here is pure (tensors in, tensors out) and reproduces the
seed's arithmetic (the SigLIP reconstruction script in `shared/seeds/`) bit for bit;
`tests/seed_reference.py` restates that arithmetic and the tests compare the
two with `torch.equal`.

Why the float8 cast: the seed rounds with a dozen elementwise ops (log2,
exp2, round, where...). Casting to `float8_e4m3fnuz` rounds to nearest with
ties to even in one pass. Both were compared on every one of the 2**32
float32 bit patterns (scale 1): once magnitudes are clamped to 240 first
(torch casts values >= 248 to NaN, while the seed saturates them at 240)
they agree everywhere except where the seed's arithmetic breaks down near
float32's top: from 0x1.ffffa8p+127 (about 3.4028147e38) upwards its
log2 rounds to 128, exp2(128) overflows and the seed returns NaN, and an
infinite magnitude gives NaN too (inf / inf). `project` reproduces exactly
that band. Such magnitudes only arise with exponents not derived from the
values, never from `tile_exponents`.

On CPU the per-tile functions (`tile_exponents`, `project_tiles`,
`projection_residual`, `pack`, `off_grid_count`, `saturated_count`) run as
fused kernels from `edgebuild.ml.quant.kernels`, which repeat `project`'s ops
element by element; other devices use the torch ops.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from edgebuild.ml.quant import kernels as f143_kernels

F143_DTYPE = torch.float8_e4m3fnuz
F143_MAX = 240.0
F143_MIN_NORMAL = 2.0**-7
F143_MIN_SUBNORMAL = 2.0**-10
F143_MANTISSA_BITS = 3
F143_EXPONENT_BIAS = 8
# Tile exponents live in [-32, 31] so that they fit a signed 6-bit field
# (and int8 in `pack`); 2**±32 is also far from float32's limits, so scaling
# a tile never overflows for weights the exponent was derived from.
EXPONENT_MIN = -32
EXPONENT_MAX = 31
TILE = 64
# Smallest float32 magnitude for which the seed's projection returns NaN
# (torch.log2 rounds it to 128, on the vectorised and the scalar path alike).
SEED_NAN_MAGNITUDE = float.fromhex("0x1.ffffa8p+127")


def project(values: torch.Tensor, exponent: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Round `values` to the nearest point of the F143 grid scaled by `2**exponent`.

    Ties go to even, magnitudes beyond 240 * 2**exponent saturate, the sign
    (also of zero: a negative value that rounds to zero gives -0.0) follows
    the input, NaN stays NaN. `exponent` broadcasts against `values` (e.g.
    one exponent per row as a column vector). The result is float32 whatever
    the input dtype: every F143 value times a scale in [2**-32, 2**31] is
    exact in float32.

    The scaling is the seed's own ops (negate, exp2, multiply; divide at the
    end), so that overflow or underflow of `values * 2**-exponent` -- possible
    only with exponents not derived from these values -- behaves as there: a
    float32-subnormal product is rounded before projection, a magnitude of
    SEED_NAN_MAGNITUDE or more (inf included) gives NaN.
    """
    values = values.to(torch.float32)
    factor = torch.exp2(-torch.as_tensor(exponent, device=values.device).to(torch.float32))
    magnitude = values.abs() * factor
    projected = magnitude.clamp(max=F143_MAX).to(F143_DTYPE).to(torch.float32)
    projected = torch.where(magnitude >= SEED_NAN_MAGNITUDE, torch.nan, projected)
    return torch.copysign(projected.div_(factor), values)


def _tile_grid(shape: torch.Size | tuple[int, ...], tile: int) -> tuple[int, int]:
    rows, cols = shape
    return math.ceil(rows / tile), math.ceil(cols / tile)


def tile_exponents(weight: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """Per-tile scale exponents `ceil(log2(max|w| / 240))`, clamped to [-32, 31], as int32.

    Shape [ceil(rows / tile), ceil(cols / tile)]; edge tiles are padded with
    zeros, which never change a maximum. An all-zero tile gets 0. The
    arithmetic runs in the weight's own dtype, as in the seed: for bf16 or
    fp16 weights that rounding can pick one exponent too low, after which
    projection saturates the tile's largest values at 240 * 2**e.
    """
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    if tile <= 0:
        raise ValueError(f"tile must be positive, got {tile}")
    maximum = _tile_abs_max(weight.detach(), tile)
    if torch.isnan(maximum).any():
        raise ValueError("weight contains NaN; it has no F143 tile scale")
    exponents = torch.where(
        maximum == 0.0,
        torch.zeros_like(maximum),
        torch.ceil(torch.log2(maximum / F143_MAX)),
    ).clamp(EXPONENT_MIN, EXPONENT_MAX)
    return exponents.to(torch.int32)


def _tile_abs_max(weight: torch.Tensor, tile: int) -> torch.Tensor:
    """max |w| per tile, in the weight's dtype (exact: a maximum is one of the values)."""
    if weight.device.type == "cpu":
        f143_kernels.use_threads(torch.get_num_threads())
        maxima = f143_kernels.tile_abs_max(weight.to(torch.float32).contiguous().numpy(), tile)
        return torch.from_numpy(maxima).to(weight.dtype)
    rows, cols = weight.shape
    row_tiles, col_tiles = _tile_grid(weight.shape, tile)
    padded = torch.nn.functional.pad(
        weight.abs(), (0, col_tiles * tile - cols, 0, row_tiles * tile - rows)
    )
    return padded.reshape(row_tiles, tile, col_tiles, tile).amax(dim=(1, 3))


def expand_exponents(
    exponents: torch.Tensor, shape: torch.Size | tuple[int, ...], tile: int = TILE
) -> torch.Tensor:
    """Per-element exponent map of `shape` from per-tile `exponents` (same dtype)."""
    _check_tile_grid(exponents, shape, tile)
    rows, cols = shape
    return exponents.repeat_interleave(tile, dim=0).repeat_interleave(tile, dim=1)[:rows, :cols]


def _check_tile_grid(exponents: torch.Tensor, shape: torch.Size | tuple[int, ...], tile: int) -> None:
    expected = _tile_grid(shape, tile)
    if tuple(exponents.shape) != expected:
        raise ValueError(
            f"exponents of shape {tuple(exponents.shape)} do not tile a {tuple(shape)} "
            f"weight with {tile}x{tile} tiles (expected {expected})"
        )


def tile_factors(exponents: torch.Tensor) -> torch.Tensor:
    """`2**-e` of each tile as float32 (exact: e is an integer in [-32, 31])."""
    return torch.exp2(-exponents.to(torch.float32))


def kernel_operands(values: torch.Tensor, exponents: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """What an `f143_kernels` call takes: the values as contiguous float32 and each
    tile's factor 2**-e as an array; also runs the kernels on torch's thread count.

    The kernels index without bounds checks: callers check the exponents' shape first.
    """
    f143_kernels.use_threads(torch.get_num_threads())
    return values.detach().to(torch.float32).contiguous(), tile_factors(exponents).contiguous().numpy()


def project_tiles(values: torch.Tensor, exponents: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """`project(values, expand_exponents(exponents, ...))`, float32, in one fused pass on CPU.

    The CPU path is `f143_kernels.project_tiles` (the same ops per element,
    bit for bit); other devices use the torch ops.
    """
    return _project_tiles(values, exponents, tile, residual=False)


def projection_residual(values: torch.Tensor, exponents: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """`values - project_tiles(values, ...)` (float32), without keeping the projection."""
    return _project_tiles(values, exponents, tile, residual=True)


def _project_tiles(values: torch.Tensor, exponents: torch.Tensor, tile: int, residual: bool) -> torch.Tensor:
    _check_tile_grid(exponents, values.shape, tile)
    if values.device.type != "cpu":
        values = values.detach().to(torch.float32)
        projected = project(values, expand_exponents(exponents, values.shape, tile))
        return values - projected if residual else projected
    values, factors = kernel_operands(values, exponents)
    output = torch.empty_like(values)
    f143_kernels.project_tiles(values.numpy(), factors, tile, output.numpy(), residual)
    return output


def quantize_nearest(weight: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """Round-to-nearest F143 with per-tile scales; the seed's `nearest` algorithm.

    Returns the weight's dtype (the seed writes into `empty_like(weight)`).
    """
    return project_tiles(weight, tile_exponents(weight, tile), tile).to(weight.dtype)


def saturated_count(weight: torch.Tensor, exponents: torch.Tensor, tile: int = TILE) -> int:
    """Number of elements at the largest magnitude of their tile, 240 * 2**e."""
    return _scan_tiles(weight, exponents, tile, store=False).saturated


class _TileScan(NamedTuple):
    scaled: torch.Tensor | None  # values * 2**-e per tile, float32, when asked for
    off_grid: int
    saturated: int


def _scan_tiles(values: torch.Tensor, exponents: torch.Tensor, tile: int, store: bool) -> _TileScan:
    """Values in units of their tile scale, and the counts `pack` and the reports need.

    One pass of `f143_kernels.scale_tiles` on CPU; elsewhere the torch ops.
    """
    _check_tile_grid(exponents, values.shape, tile)
    if values.device.type != "cpu":
        values = values.detach().to(torch.float32)
        scaled = values * expand_exponents(tile_factors(exponents), values.shape, tile)
        off_grid = int((project(values, expand_exponents(exponents, values.shape, tile)) != values).sum())
        return _TileScan(scaled if store else None, off_grid, int((scaled.abs() == F143_MAX).sum()))
    values, factors = kernel_operands(values, exponents)
    # The kernel takes a [1, 1] placeholder when it is not to store the scaled values.
    scaled = torch.empty_like(values) if store else torch.empty(1, 1)
    off_grid, saturated = f143_kernels.scale_tiles(values.numpy(), factors, tile, scaled.numpy(), store)
    return _TileScan(scaled if store else None, int(off_grid), int(saturated))


def off_grid_count(weight: torch.Tensor, exponents: torch.Tensor, tile: int = TILE) -> int:
    """Number of elements that are not an F143 value (|v| <= 240) times their tile scale.

    An element is on the grid exactly when projecting it changes nothing:
    projection is the identity on the grid, and a value it maps to itself
    is a grid value times 2**e (the division by a power of two that ends the
    projection is exact for exponents in [-32, 31]). NaN and inf count as
    off-grid.
    """
    return _scan_tiles(weight, exponents, tile, store=False).off_grid


def on_grid(weight: torch.Tensor, exponents: torch.Tensor, tile: int = TILE) -> bool:
    """Whether every element of `weight` is representable with the given tile exponents."""
    return off_grid_count(weight, exponents, tile) == 0


def pack(
    weight: torch.Tensor, tile: int = TILE, exponents: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split an on-grid weight into float8_e4m3fnuz codes and int8 tile exponents.

    `exponents` defaults to `tile_exponents(weight)`: quantization can only
    lower a tile's maximum, and an F143 weight stays representable one or
    more exponents lower as long as it fits under 240 * 2**e, so recomputing
    is always valid. Raises ValueError when some element is off the grid
    (packing would silently round it). Note float8_e4m3fnuz has no -0.0: a
    negative zero packs to the single zero code and unpacks as +0.0.
    """
    if exponents is None:
        exponents = tile_exponents(weight, tile)
    if exponents.numel() and (
        int(exponents.min()) < EXPONENT_MIN or int(exponents.max()) > EXPONENT_MAX
    ):
        raise ValueError(
            f"tile exponents must lie in [{EXPONENT_MIN}, {EXPONENT_MAX}], got "
            f"[{int(exponents.min())}, {int(exponents.max())}]"
        )
    scan = _scan_tiles(weight, exponents, tile, store=True)
    if scan.off_grid:
        raise ValueError(
            f"{scan.off_grid} of {weight.numel()} weight elements are not on the F143 grid "
            "of their tile scale; quantize before packing"
        )
    assert scan.scaled is not None
    return scan.scaled.to(F143_DTYPE), exponents.to(torch.int8)


def unpack(
    codes: torch.Tensor,
    exponents: torch.Tensor,
    tile: int = TILE,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Rebuild weights from codes and tile exponents; exact in float32 and bfloat16.

    float16 cannot hold every scale (2**31 * 240 overflows it); the cast
    then rounds like any other float16 conversion.
    """
    if codes.dtype != F143_DTYPE:
        raise ValueError(f"codes must be {F143_DTYPE}, got {codes.dtype}")
    element_exponents = expand_exponents(exponents, codes.shape, tile)
    values = codes.to(torch.float32) * torch.exp2(element_exponents.to(torch.float32))
    return values.to(dtype)
