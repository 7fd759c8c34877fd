"""F143 projection, tile exponents, grid conformance and packing.

The projection is checked against a definition written from scratch: the 256
float8_e4m3fnuz codes give the value set, and the nearest value (ties to the
even code) is found by brute force. It is also checked against the seed's own
arithmetic (`seed_reference.project_f143`), bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from edgebuild.ml.quant import f143
from tests import seed_reference


def _grid() -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negative F143 values in ascending order and their codes (0..127)."""
    codes = torch.arange(256, dtype=torch.int64)
    values = codes.to(torch.uint8).view(torch.float8_e4m3fnuz).to(torch.float64)
    keep = (codes < 128) & ~torch.isnan(values)
    return values[keep], codes[keep]


GRID, GRID_CODES = _grid()


def brute_force_nearest(values: torch.Tensor) -> torch.Tensor:
    """Nearest F143 value of each float32 magnitude (ties to the even code), signed like the input.

    Everything above 240 maps to 240: it is the largest value of the set.
    Magnitudes are capped at 2**20 first, which changes no answer but keeps
    float64 distances from huge values distinct.
    """
    magnitude = values.abs().to(torch.float64).clamp(max=2.0**20)
    distance = (magnitude[:, None] - GRID[None, :]).abs()
    best = distance.min(dim=1, keepdim=True).values
    tied = distance == best
    # Among the nearest candidates prefer an even code; a tie is always
    # between two neighbours, exactly one of which is even.
    preference = tied.to(torch.int64) * 2 + (GRID_CODES[None, :] % 2 == 0).to(torch.int64)
    chosen = GRID[preference.argmax(dim=1)].to(torch.float32)
    return torch.copysign(chosen, values)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.int32)


def _next_up(values: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(values, torch.full_like(values, float("inf")))


def _next_down(values: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(values, torch.zeros_like(values))


def test_grid_is_the_documented_format() -> None:
    assert GRID.numel() == 128
    assert GRID[0].item() == 0.0
    assert GRID[1].item() == f143.F143_MIN_SUBNORMAL == 2.0**-10
    assert GRID[8].item() == f143.F143_MIN_NORMAL == 2.0**-7
    assert GRID[-1].item() == f143.F143_MAX == 240.0
    # 3 mantissa bits: 8 values per binade from 2**-7 to 2**7.
    assert torch.equal(GRID[8:16], (1 + torch.arange(8) / 8).double() * 2.0**-7)


def _special_values() -> torch.Tensor:
    grid = GRID.to(torch.float32)
    midpoints = (grid[:-1] + grid[1:]) / 2
    beyond = torch.tensor(
        [240.5, 244.0, 247.99998, 248.0, 248.00002, 256.0, 1000.0, 1e10, 1e30, 3.0e38]
    )
    subnormal_steps = torch.arange(0, 17, dtype=torch.float32) * 2.0**-11
    tiny = torch.tensor([1e-45, 1e-40, 2.0**-126, 1e-20, 2.0**-12, 2.0**-11 * 1.0000001])
    magnitudes = torch.cat(
        [
            grid,
            midpoints,
            _next_up(midpoints),
            _next_down(midpoints),
            _next_up(grid),
            _next_down(grid[1:]),
            beyond,
            subnormal_steps,
            tiny,
        ]
    )
    return torch.cat([magnitudes, -magnitudes])


def test_project_matches_brute_force_on_grid_midpoints_and_edges() -> None:
    values = _special_values()
    expected = brute_force_nearest(values)
    assert torch.equal(_bits(f143.project(values)), _bits(expected))


def test_project_rounds_ties_to_even_and_saturates() -> None:
    cases = {
        # (value, expected): ties between neighbours go to the even code
        1.0625: 1.0,  # between 1.0 (even) and 1.125
        1.1875: 1.25,  # between 1.125 and 1.25 (even)
        2.0**-11: 0.0,  # between 0 and the smallest subnormal
        3 * 2.0**-11: 2.0**-9,  # between codes 1 and 2
        15 * 2.0**-11: 2.0**-7,  # largest subnormal vs smallest normal
        232.0: 224.0,  # between 224 (even) and 240
        247.0: 240.0,
        248.0: 240.0,  # torch's own cast gives NaN here
        1e30: 240.0,
    }
    values = torch.tensor(list(cases))
    assert f143.project(values).tolist() == list(cases.values())
    assert (f143.project(-values) == -torch.tensor(list(cases.values()))).all()


def test_project_zero_keeps_sign_like_the_seed() -> None:
    values = torch.tensor([0.0, -0.0, -1e-30, 1e-30])
    result = f143.project(values)
    assert torch.equal(_bits(result), _bits(torch.tensor([0.0, -0.0, -0.0, 0.0])))


@pytest.mark.parametrize("exponent", [-32, -7, -1, 0, 3, 31])
def test_project_scaled_grid_matches_brute_force(exponent: int) -> None:
    generator = torch.Generator().manual_seed(exponent + 100)
    unit = torch.randn(20_000, generator=generator) * torch.exp2(
        torch.randint(-14, 9, (20_000,), generator=generator).float()
    )
    values = torch.cat([unit, _special_values()]) * 2.0**exponent
    values = values[torch.isfinite(values)]  # 3e38 * 2**31 overflows; covered elsewhere
    expected = brute_force_nearest(values * 2.0**-exponent) * 2.0**exponent
    assert torch.equal(_bits(f143.project(values, exponent)), _bits(expected))


@pytest.mark.parametrize("exponent", [-32, 0, 31])
def test_project_matches_seed_arithmetic_on_random_bit_patterns(exponent: int) -> None:
    """Any float32 at all, NaN/inf and the seed's NaN band near float32's maximum included."""
    generator = torch.Generator().manual_seed(7)
    patterns = torch.randint(-(2**31), 2**31, (1 << 18,), generator=generator, dtype=torch.int64)
    band = torch.arange(0x7F7FFFC0, 0x7F800002, dtype=torch.int64)  # up to inf and a NaN
    bits = torch.cat([patterns, band, band - 2**32]).to(torch.int32)
    values = bits.view(torch.float32)
    actual = f143.project(values, exponent)
    expected = seed_reference.project_f143(values, float(exponent))
    both_nan = torch.isnan(actual) & torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), torch.isnan(expected))
    assert torch.equal(_bits(actual)[~both_nan], _bits(expected)[~both_nan])


def test_project_near_float32_maximum_follows_the_seed() -> None:
    threshold = torch.tensor([f143.SEED_NAN_MAGNITUDE])
    below = _next_down(threshold)
    assert f143.project(below).item() == 240.0
    assert torch.isnan(f143.project(threshold)).item()
    assert torch.isnan(f143.project(torch.tensor([float("inf"), -float("inf")]))).all()
    assert torch.isnan(f143.project(torch.tensor([float("nan")]))).item()


def test_project_broadcasts_per_row_exponents() -> None:
    # Scaling only moves the ends of the grid: the subnormal floor and the 240 cap.
    values = torch.tensor([[0.001, 300.0], [0.001, 300.0]])
    result = f143.project(values, torch.tensor([[0], [2]]))
    assert result.tolist() == [[2.0**-10, 240.0], [0.0, 288.0]]


def _tile_weight() -> torch.Tensor:
    """130 x 100 weight: 3 x 2 tiles, the last row and column of tiles partial."""
    weight = torch.zeros(130, 100)
    weight[:64, :64] = 0.5
    weight[5, 7] = -240.0  # tile (0, 0): exactly 240 -> e = 0
    weight[:64, 64:] = 1.0
    weight[63, 99] = 241.0  # tile (0, 1): just above 240 -> e = 1
    # tile (1, 0) stays all zero -> e = 0
    weight[64:128, 64:] = 1e-20  # tile (1, 1): -74 clamped to -32
    weight[128:, :64] = 240.0 * 2.0**-5  # tile (2, 0), 2 rows: e = -5
    weight[129, 99] = 2.0**40  # tile (2, 1), 2 x 36: 33 clamped to 31
    return weight


def test_tile_exponents_with_partial_edge_tiles() -> None:
    exponents = f143.tile_exponents(_tile_weight())
    assert exponents.dtype == torch.int32
    assert exponents.tolist() == [[0, 1], [0, -32], [-5, 31]]


def test_tile_exponents_match_seed_column_block_scales() -> None:
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(150, 170, generator=generator) * torch.exp2(
        torch.randint(-20, 12, (150, 1), generator=generator).float()
    )
    weight[64:128, 64:128] = 0.0
    expanded = f143.expand_exponents(f143.tile_exponents(weight), weight.shape)
    for start in range(0, 170, 64):
        seed = seed_reference.f143_scales_by_row_block(weight[:, start : start + 64], 64)
        block = expanded[:, start : start + 64]
        assert torch.equal(block, seed.to(torch.int32)[:, None].expand_as(block))


@pytest.mark.parametrize("exponent", range(f143.EXPONENT_MIN, f143.EXPONENT_MAX + 1))
def test_tile_exponent_of_exact_and_next_powers(exponent: int) -> None:
    weight = torch.zeros(64, 128)
    weight[3, 3] = 240.0 * 2.0**exponent
    weight[3, 70] = 240.0 * 2.0**exponent * (1 + 2.0**-10)
    expected_next = min(exponent + 1, f143.EXPONENT_MAX)
    assert f143.tile_exponents(weight).tolist() == [[exponent, expected_next]]


def test_tile_exponents_of_bfloat16_round_like_the_seed() -> None:
    """The seed computes exponents in the weight's dtype; bf16's log2 can round one too low.

    max = 241 * 2**8: in float32 ceil(log2(257.07)) = 9; in bf16, log2 gives
    8.0112, which rounds to 8.0. The tile then saturates (241 -> 240) but gains
    a finer subnormal floor (0.25 survives; at e = 9 it is a tie that goes to 0).
    """
    weight = torch.zeros(64, 64)
    weight[0, 0] = 241.0 * 2.0**8
    weight[1, 1] = 0.25
    assert f143.tile_exponents(weight).tolist() == [[9]]
    assert f143.tile_exponents(weight.bfloat16()).tolist() == [[8]]
    assert f143.quantize_nearest(weight)[1, 1].item() == 0.0
    assert f143.quantize_nearest(weight.bfloat16())[1, 1].item() == 0.25
    assert f143.quantize_nearest(weight.bfloat16())[0, 0].item() == 240.0 * 2.0**8


def test_tile_exponents_rejects_nan() -> None:
    weight = torch.zeros(10, 10)
    weight[2, 2] = float("nan")
    with pytest.raises(ValueError, match="weight contains NaN"):
        f143.tile_exponents(weight)


def test_expand_exponents_checks_shape() -> None:
    exponents = torch.tensor([[1, 2], [3, 4]])
    assert f143.expand_exponents(exponents, (65, 70))[64, 64].item() == 4
    assert f143.expand_exponents(exponents, (65, 70))[63, 63].item() == 1
    with pytest.raises(ValueError, match=r"expected \(1, 2\)"):
        f143.expand_exponents(exponents, (64, 70))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_nearest_matches_seed(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(11)
    weight = (torch.randn(130, 100, generator=generator) * 0.05).to(dtype)
    weight[:64, 64:] *= 1000.0
    weight[64:, :64] = 0.0
    result = f143.quantize_nearest(weight)
    assert result.dtype == dtype
    assert torch.equal(result, seed_reference.nearest_f143_weight(weight, 64))


def _quantized_weight(seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(130, 100, generator=generator) * 0.02
    weight[64:, 64:] *= 3e4
    quantized = f143.quantize_nearest(weight)
    return quantized, f143.tile_exponents(weight)


def test_on_grid_detects_one_perturbed_element() -> None:
    quantized, exponents = _quantized_weight()
    assert f143.on_grid(quantized, exponents)
    assert f143.off_grid_count(quantized, exponents) == 0
    nudged = quantized.clone()
    nudged[100, 80] = _next_up(nudged[100, 80 : 81])[0]
    assert f143.off_grid_count(nudged, exponents) == 1
    assert not f143.on_grid(nudged, exponents)


def test_on_grid_detects_a_value_beyond_the_tile_range() -> None:
    quantized, exponents = _quantized_weight()
    beyond = quantized.clone()
    # 256 * 2**e is a power of two (so on the unscaled mantissa grid) but above 240.
    beyond[0, 0] = 256.0 * 2.0 ** exponents[0, 0].item()
    assert f143.off_grid_count(beyond, exponents) == 1


def test_pack_unpack_round_trip_is_bit_exact() -> None:
    quantized, exponents = _quantized_weight()
    codes, packed_exponents = f143.pack(quantized)
    assert codes.dtype == torch.float8_e4m3fnuz and codes.shape == quantized.shape
    assert packed_exponents.dtype == torch.int8 and packed_exponents.shape == (3, 2)
    restored = f143.unpack(codes, packed_exponents)
    assert restored.dtype == torch.float32
    # float8_e4m3fnuz has a single zero: -0.0 comes back as +0.0 (+0.0 normalises it).
    assert torch.equal(_bits(restored), _bits(quantized + 0.0))
    assert torch.equal(f143.unpack(codes, packed_exponents, dtype=torch.bfloat16).float(), quantized)
    # With the quantization's own exponents the codes are the same values.
    codes_given, given = f143.pack(quantized, exponents=exponents)
    assert torch.equal(f143.unpack(codes_given, given), quantized)


def test_packed_size_is_a_quarter_of_float32() -> None:
    quantized, _ = _quantized_weight()
    codes, exponents = f143.pack(quantized)
    packed = codes.numel() * codes.element_size() + exponents.numel() * exponents.element_size()
    assert packed == 130 * 100 + 6
    assert packed / (quantized.numel() * 4) == pytest.approx(0.25, abs=2e-4)


def test_pack_rejects_off_grid_weights() -> None:
    quantized, _ = _quantized_weight()
    nudged = quantized.clone()
    nudged[7, 3] = _next_up(nudged[7, 3:4])[0]
    with pytest.raises(ValueError, match="^1 of 13000 weight elements are not on the F143 grid"):
        f143.pack(nudged)
    with pytest.raises(ValueError, match="not on the F143 grid"):
        f143.pack(torch.randn(64, 64, generator=torch.Generator().manual_seed(5)))


def test_pack_rejects_exponents_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"tile exponents must lie in \[-32, 31\], got \[0, 40\]"):
        f143.pack(torch.zeros(64, 128), exponents=torch.tensor([[0, 40]]))


def test_unpack_requires_float8_codes() -> None:
    with pytest.raises(ValueError, match="codes must be torch.float8_e4m3fnuz"):
        f143.unpack(torch.zeros(4, 4), torch.zeros(1, 1))
