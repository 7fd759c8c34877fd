"""Fused CPU kernels for F143 projection and block GPTQ, compiled with numba.

The torch formulations in `edgebuild.f143` and `edgebuild.gptq` are exact
but memory-bound: every GPTQ column streams the whole weight through several
elementwise ops (64 passes per linear). These kernels do the same arithmetic
per element, in the same order, on one cache-sized chunk at a time (one
64-column block x `CHUNK_ROWS` rows, the chunks spread over threads), so the
results are bit for bit the torch ones; `tests/test_f143_kernels.py` checks
that, including projection over every float32 magnitude that can round to a
nonzero F143 value.

Why bit-exact holds:
- Only IEEE-exact single operations are used (+ - * /, abs, compares, bit
  ops), all in float32: the constants are float32, so nothing is promoted to
  float64 and rounded again.
- numba compiles without fast-math, so LLVM neither reassociates nor
  contracts `w - e * f` into a fused multiply-add (an FMA rounds once where
  torch rounds twice; `test_kernel_has_no_fused_multiply_add` reads the
  generated assembly to keep it that way).
- Rounding to F143 is done on the float32 bits: in the normal range
  (>= 2**-7) by rounding the 23-bit mantissa to 3 bits, ties to even; below
  it by adding and subtracting 2**13, whose float32 spacing is F143's
  subnormal step 2**-10 (the hardware rounds that add to nearest even). This
  is what the float8_e4m3fnuz cast does for magnitudes up to 240.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# One task: a 64-column block of this many rows, [64, 256] float32 = 64 KiB,
# which stays in L2 through its 64 column steps.
CHUNK_ROWS = 256

_SIGN_BITS = 0x80000000
_MIN_NORMAL_BITS = 0x3C000000  # 2**-7, smallest normal F143 magnitude
_MAX_BITS = 0x43700000  # 240.0
_NAN_FROM_BITS = 0x7F7FFFD4  # f143.SEED_NAN_MAGNITUDE: the seed's projection gives NaN from here up
_QUIET_NAN_BITS = 0x7FC00000
_DROPPED_MANTISSA = 20  # float32 keeps 23 mantissa bits, F143 keeps 3
_HALF_ULP_MINUS_ONE = (1 << (_DROPPED_MANTISSA - 1)) - 1
_KEPT_MASK = 0xFFFFFFFF ^ ((1 << _DROPPED_MANTISSA) - 1)
# float32 numbers in [2**13, 2**14) are spaced 2**-10 apart: F143's subnormal step.
_SUBNORMAL_SHIFT = np.float32(2.0**13)
_MAX = np.float32(240.0)


@intrinsic
def _bits(typingctx, value):
    """The IEEE bits of a float32, as int64 (numba's integer arithmetic is 64-bit)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))

    return types.int64(types.float32), codegen


@intrinsic
def _from_bits(typingctx, value):
    """The float32 whose bits are the low 32 bits of an integer."""
    if not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())

    return types.float32(value), codegen


@numba.njit(inline="always")
def _project(value, factor):
    """f143.project of one float32 with factor = 2**-exponent (float32): same ops, same result."""
    magnitude = abs(value) * factor
    bits = _bits(magnitude)
    rounded = _from_bits((bits + _HALF_ULP_MINUS_ONE + ((bits >> _DROPPED_MANTISSA) & 1)) & _KEPT_MASK)
    subnormal = (magnitude + _SUBNORMAL_SHIFT) - _SUBNORMAL_SHIFT
    projected = rounded if bits >= _MIN_NORMAL_BITS else subnormal
    projected = _from_bits(_MAX_BITS) if bits > _MAX_BITS else projected
    projected = _from_bits(_QUIET_NAN_BITS) if bits >= _NAN_FROM_BITS else projected
    return _from_bits(_bits(projected / factor) | (_bits(value) & _SIGN_BITS))


@numba.njit(parallel=True, cache=True)
def project_tiles(values, tile_factors, tile, output, residual):
    """Project a float32 [rows, cols] matrix with one factor 2**-e per tile x tile tile.

    Writes the projection into `output`, or with `residual` true
    `values - projection` (without storing the projection).
    """
    rows, cols = values.shape
    for row in numba.prange(rows):
        factors = tile_factors[row // tile]
        for first in range(0, cols, tile):
            factor = factors[first // tile]
            # Slices indexed from 0: LLVM then sees unit-stride, non-negative
            # indices and vectorises (indexing from `first` compiled to gathers).
            source = values[row, first : first + tile]
            target = output[row, first : first + tile]
            for col in range(source.shape[0]):
                projected = _project(source[col], factor)
                # Loop-invariant: LLVM hoists the choice out of the loop.
                target[col] = source[col] - projected if residual else projected


@numba.njit(parallel=True, cache=True)
def scale_tiles(values, tile_factors, tile, scaled, store):
    """Scale a float32 [rows, cols] matrix to F143 units, `values * 2**-e` per tile.

    Writes the scaled values into `scaled` when `store` is true (else `scaled`
    is a [1, 1] placeholder), and returns
    two counts: values off the grid (projecting them would change them: they
    are not an F143 value times 2**e; NaN included, as NaN != NaN) and values
    at their tile's largest magnitude, 240 * 2**e.
    """
    rows, cols = values.shape
    off_grid = 0
    saturated = 0
    for row in numba.prange(rows):
        factors = tile_factors[row // tile]
        row_off_grid = 0
        row_saturated = 0
        for first in range(0, cols, tile):
            factor = factors[first // tile]
            source = values[row, first : first + tile]
            target = scaled[row, first : first + tile] if store else scaled[0, 0:0]
            for col in range(source.shape[0]):
                value = source[col]
                # Scaling by a power of two is exact for on-grid values.
                units = value * factor
                if store:
                    target[col] = units
                row_off_grid += _project(value, factor) != value
                row_saturated += abs(units) == _MAX
        off_grid += row_off_grid
        saturated += row_saturated
    return off_grid, saturated


@numba.njit(inline="always")
def _larger(candidate, largest):
    """max(candidate, largest) where a NaN on either side wins (as in torch.amax)."""
    return candidate if (not candidate <= largest) and largest == largest else largest


@numba.njit(parallel=True, cache=True)
def tile_abs_max(values, tile):
    """max |v| of each tile x tile tile of a float32 [rows, cols] matrix (NaN if the tile has one)."""
    rows, cols = values.shape
    row_tiles = (rows + tile - 1) // tile
    col_tiles = (cols + tile - 1) // tile
    maxima = np.empty((row_tiles, col_tiles), np.float32)
    for row_tile in numba.prange(row_tiles):
        # Column-wise maxima over the tile's rows first: elementwise, so it vectorises.
        columns = np.zeros(cols, np.float32)
        for row in range(row_tile * tile, min(row_tile * tile + tile, rows)):
            source = values[row]
            for col in range(cols):
                columns[col] = _larger(abs(source[col]), columns[col])
        for col_tile in range(col_tiles):
            largest = np.float32(0.0)
            for col in range(col_tile * tile, min(col_tile * tile + tile, cols)):
                largest = _larger(columns[col], largest)
            maxima[row_tile, col_tile] = largest
    return maxima


@numba.njit(parallel=True, cache=True)
def gptq_blocks(weight, factors, divisors, tile_factors, output, residual):
    """GPTQ of every block column of a float32 [rows, width] weight into `output`,
    and `weight - output` into `residual`.

    `factors` [blocks, b, b] are the upper Cholesky factors of the blocks'
    inverse Hessians, `divisors` [blocks, b] their clamped diagonals,
    `tile_factors` [row tiles, blocks] the scale 2**-e of each b x b tile.
    Per block and row, column c is projected, its error divided by the
    diagonal, and error * factor[c, j] subtracted from every later column j:
    `gptq.gptq_quantize`'s ops, one element at a time.
    """
    rows, width = weight.shape
    blocks, block, _ = factors.shape
    chunks = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
    for task in numba.prange(blocks * chunks):
        block_index = task // chunks
        first_row = (task % chunks) * CHUNK_ROWS
        count = min(CHUNK_ROWS, rows - first_row)
        first_col = block_index * block
        cols = min(block, width - first_col)
        # Columns outer, rows inner and contiguous: each update is a long vector.
        # Views indexed from 0, so that LLVM sees non-negative indices (see project_tiles).
        weight_chunk = weight[first_row : first_row + count, first_col : first_col + cols]
        output_chunk = output[first_row : first_row + count, first_col : first_col + cols]
        residual_chunk = residual[first_row : first_row + count, first_col : first_col + cols]
        working = np.empty((cols, count), np.float32)
        for col in range(cols):
            for row in range(count):
                working[col, row] = weight_chunk[row, col]
        scales = np.empty(count, np.float32)
        for row in range(count):
            scales[row] = tile_factors[(first_row + row) // block, block_index]
        quantized = np.empty((cols, count), np.float32)
        errors = np.empty(count, np.float32)
        for col in range(cols):
            divisor = divisors[block_index, col]
            current = working[col]
            result = quantized[col]
            for row in range(count):
                value = current[row]
                projected = _project(value, scales[row])
                result[row] = projected
                errors[row] = (value - projected) / divisor
            for later in range(col + 1, cols):
                factor = factors[block_index, col, later]
                target = working[later]
                for row in range(count):
                    target[row] = target[row] - errors[row] * factor
        for row in range(count):
            for col in range(cols):
                output_chunk[row, col] = quantized[col, row]
                residual_chunk[row, col] = weight_chunk[row, col] - quantized[col, row]


def use_threads(count: int) -> None:
    """Run the kernels on `count` threads (the caller's torch thread count), within numba's pool."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))
