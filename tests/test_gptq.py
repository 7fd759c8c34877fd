"""Batched block-diagonal GPTQ against the seed's per-block, per-column loops.

Every weight, factor and Hessian must be bit-identical (`torch.equal`) to
`seed_reference`, which restates the seed's arithmetic one block at a time.
"""

from __future__ import annotations

import pytest
import torch

from edgebuild.ml.quant import f143, gptq
from tests import seed_reference


def _inputs(
    width: int, tokens: int, seed: int, batches: int = 2
) -> list[torch.Tensor]:
    """Calibration batches with uneven channel scales (some channels tiny)."""
    generator = torch.Generator().manual_seed(seed)
    channel_scale = torch.rand(width, generator=generator) ** 3 * 4
    return [
        torch.randn(tokens, width, generator=generator) * channel_scale
        for _ in range(batches)
    ]


def _weight(rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    row_scale = torch.exp2(torch.randint(-6, 3, (rows, 1), generator=generator).float())
    return torch.randn(rows, cols, generator=generator) * 0.05 * row_scale


def _statistics(inputs: list[torch.Tensor], block_size: int = 64) -> gptq.BlockHessians:
    state = gptq.empty_block_hessians(inputs[0].shape[-1], block_size)
    for batch in inputs:
        state = gptq.accumulate_block_hessians(state, batch)
    return state


def _assert_blocks_equal(batched: torch.Tensor, blocks: list[torch.Tensor]) -> None:
    assert batched.shape[0] == len(blocks)
    for index, block in enumerate(blocks):
        width = block.shape[0]
        assert torch.equal(batched[index, :width, :width], block), f"block {index}"


@pytest.mark.parametrize("width", [64, 100, 200])
def test_block_hessians_match_seed_addmm(width: int) -> None:
    inputs = _inputs(width, 300, seed=width)
    state = _statistics(inputs)
    _assert_blocks_equal(state.hessians, seed_reference.block_hessians(inputs, 64))
    blocks = state.hessians.shape[0]
    last = width - (blocks - 1) * 64
    assert not state.hessians[-1, last:, :].any() and not state.hessians[-1, :, last:].any()
    assert state.count == 600
    expected_sum = torch.zeros(width).add_(inputs[0].sum(dim=0)).add_(inputs[1].sum(dim=0))
    assert torch.equal(state.input_sum, expected_sum)
    assert torch.equal(state.input_mean, expected_sum / 600)


def test_block_hessians_accept_token_batches_and_stay_pure() -> None:
    inputs = _inputs(100, 60, seed=4)
    empty = gptq.empty_block_hessians(100)
    shaped = gptq.accumulate_block_hessians(empty, inputs[0].reshape(3, 20, 100))
    flat = gptq.accumulate_block_hessians(empty, inputs[0])
    assert torch.equal(shaped.hessians, flat.hessians) and shaped.count == 60
    assert not empty.hessians.any() and empty.count == 0
    with pytest.raises(ValueError, match="inputs have 99 features, statistics expect 100"):
        gptq.accumulate_block_hessians(empty, torch.zeros(5, 99))


@pytest.mark.parametrize("damp", [0.0, 0.01, 0.1])
@pytest.mark.parametrize("width", [64, 100, 200])
def test_inverse_hessian_factors_match_seed(width: int, damp: float) -> None:
    inputs = _inputs(width, 200, seed=width + 1)
    state = _statistics(inputs)
    factors = gptq.inverse_hessian_factors(state.hessians, damp, width)
    expected = [
        seed_reference.inverse_hessian_factor(hessian, damp)
        for hessian in seed_reference.block_hessians(inputs, 64)
    ]
    _assert_blocks_equal(factors, expected)
    last = expected[-1].shape[0]
    padding = factors[-1].clone()
    padding[:last, :last] = 0.0
    identity = torch.eye(64)
    identity[:last, :last] = 0.0
    assert torch.equal(padding, identity)


def _rank_deficient_inputs() -> list[torch.Tensor]:
    """Block 0 full rank; block 1 spanned by 3 vectors, so undamped Cholesky fails there."""
    generator = torch.Generator().manual_seed(9)
    inputs = torch.randn(400, 128, generator=generator)
    basis = torch.randn(400, 3, generator=generator)
    inputs[:, 64:] = basis @ torch.randn(3, 64, generator=generator)
    return [inputs]


def test_cholesky_fallback_is_per_block() -> None:
    inputs = _rank_deficient_inputs()
    hessians = seed_reference.block_hessians(inputs, 64)
    factors = gptq.inverse_hessian_factors(_statistics(inputs).hessians, 0.0)
    _assert_blocks_equal(factors, [seed_reference.inverse_hessian_factor(h, 0.0) for h in hessians])
    # Block 1 took the diag(H)^-1/2 fallback, block 0 a real Cholesky factor.
    assert torch.equal(factors[1], torch.diag(torch.diagonal(factors[1])))
    assert torch.count_nonzero(torch.triu(factors[0], diagonal=1)) > 0


def test_inverse_hessian_factors_check_arguments() -> None:
    with pytest.raises(ValueError, match="damp must be non-negative, got -0.1"):
        gptq.inverse_hessian_factors(torch.zeros(2, 64, 64), -0.1)
    with pytest.raises(ValueError, match="2 Hessian blocks of 64 do not cover 200 inputs"):
        gptq.inverse_hessian_factors(torch.zeros(2, 64, 64), 0.01, 200)


@pytest.mark.parametrize(
    ("rows", "cols", "damp"),
    [(70, 100, 0.01), (70, 100, 0.0), (130, 200, 0.1), (64, 64, 0.01), (33, 150, 0.001)],
)
@pytest.mark.slow
def test_gptq_quantize_matches_seed_block_by_block(rows: int, cols: int, damp: float) -> None:
    weight = _weight(rows, cols, seed=rows + cols)
    inputs = _inputs(cols, 150, seed=cols)
    factors = gptq.inverse_hessian_factors(_statistics(inputs).hessians, damp, cols)
    result = gptq.gptq_quantize(weight, factors, f143.tile_exponents(weight))
    for index, start in enumerate(range(0, cols, 64)):
        block = weight[:, start : start + 64]
        width = block.shape[1]
        expected = seed_reference.gptq_block(
            block,
            factors[index, :width, :width],
            seed_reference.f143_scales_by_row_block(block, 64),
        )
        assert torch.equal(result[:, start : start + 64], expected), f"block {index}"
    # GPTQ output is always representable with the original tile exponents.
    assert f143.on_grid(result, f143.tile_exponents(weight))


def test_gptq_quantize_rejects_mismatched_factors() -> None:
    with pytest.raises(ValueError, match=r"factors of shape \(1, 64, 64\) do not match a width of 100"):
        gptq.gptq_quantize(torch.zeros(8, 100), torch.zeros(1, 64, 64), torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"exponents of shape \(1, 1\) do not tile a 8x100 weight"):
        gptq.gptq_quantize(torch.zeros(8, 100), torch.zeros(2, 64, 64), torch.zeros(1, 1))


@pytest.mark.parametrize("algorithm", ["gptq", "nearest"])
@pytest.mark.parametrize(("rows", "cols", "damp"), [(70, 100, 0.01), (130, 200, 0.05)])
def test_reconstruct_matches_seed(rows: int, cols: int, damp: float, algorithm: str) -> None:
    weight = _weight(rows, cols, seed=rows)
    inputs = _inputs(cols, 200, seed=cols + 7)
    result = gptq.reconstruct(weight, _statistics(inputs).hessians, damp, algorithm)
    expected, nearest, rebuilt = seed_reference.reconstruct_linear(
        weight, seed_reference.block_hessians(inputs, 64), 64, damp, algorithm
    )
    assert torch.equal(result.weight, expected)
    assert result.nearest_objective == pytest.approx(nearest, rel=1e-6)
    assert result.reconstructed_objective == pytest.approx(rebuilt, rel=1e-6)
    if algorithm == "gptq":
        assert result.reconstructed_objective < result.nearest_objective
    else:
        assert result.reconstructed_objective == result.nearest_objective


def test_reconstruct_rank_deficient_and_bfloat16_match_seed() -> None:
    inputs = _rank_deficient_inputs()
    weight = _weight(70, 128, seed=12).to(torch.bfloat16)
    result = gptq.reconstruct(weight, _statistics(inputs).hessians, 0.0, "gptq")
    expected, _, _ = seed_reference.reconstruct_linear(
        weight, seed_reference.block_hessians(inputs, 64), 64, 0.0, "gptq"
    )
    assert result.weight.dtype == torch.bfloat16
    assert torch.equal(result.weight, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ["gptq", "nearest"])
def test_reconstruct_into_a_destination_writes_the_same_weight_there(dtype: torch.dtype, algorithm: str) -> None:
    """The build's route: the weight goes into its place in the output file. A float32
    GPTQ on CPU is written there by the kernel, any other by a copy; the bits and the
    residual are those of a reconstruction into memory of its own."""
    weight = _weight(70, 100, seed=8).to(dtype)
    hessians = _statistics(_inputs(100, 100, seed=9)).hessians
    alone = gptq.reconstruct(weight, hessians, algorithm=algorithm)
    # A place of its own, and the weight's own memory (written over, as the seed does).
    own = weight.clone()
    for source, destination in ((weight, torch.full_like(weight, float("nan"))), (own, own)):
        result = gptq.reconstruct(source, hessians, algorithm=algorithm, out=destination)
        assert result.weight is destination
        assert torch.equal(destination, alone.weight)
        assert torch.equal(result.residual, alone.residual)
        assert (result.nearest_objective, result.reconstructed_objective, result.saturated) == (
            alone.nearest_objective, alone.reconstructed_objective, alone.saturated)


def test_reconstruct_checks_arguments() -> None:
    hessians = torch.zeros(2, 64, 64)
    with pytest.raises(ValueError, match="algorithm must be one of \\('gptq', 'nearest'\\), got 'rtn'"):
        gptq.reconstruct(torch.zeros(8, 100), hessians, 0.01, "rtn")
    with pytest.raises(ValueError, match=r"Hessians of shape \(2, 64, 64\) do not match a width of 300"):
        gptq.reconstruct(torch.zeros(8, 300), hessians)
    with pytest.raises(ValueError, match=r"out is torch.float16 \(8, 100\), the weight torch.float32 \(8, 100\)"):
        gptq.reconstruct(torch.zeros(8, 100), hessians, out=torch.zeros(8, 100, dtype=torch.float16))


def test_bias_correction_matches_seed() -> None:
    weight = _weight(70, 100, seed=3)
    inputs = _inputs(100, 100, seed=5)
    state = _statistics(inputs)
    result = gptq.reconstruct(weight, state.hessians)
    correction = gptq.bias_correction(result.residual, state.input_mean)
    expected = seed_reference.bias_correction(weight, result.weight, state.input_mean)
    assert correction.shape == (70,)
    assert torch.equal(correction, expected)
    assert correction.abs().max() > 0
    assert not gptq.bias_correction(torch.zeros_like(weight), state.input_mean).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("algorithm", ["gptq", "nearest"])
def test_reconstruct_residual_is_original_minus_stored_weight(dtype: torch.dtype, algorithm: str) -> None:
    weight = _weight(70, 100, seed=4).to(dtype)
    result = gptq.reconstruct(weight, _statistics(_inputs(100, 100, seed=6)).hessians, algorithm=algorithm)
    assert result.residual.dtype == torch.float32
    assert torch.equal(result.residual, weight.float() - result.weight.float())


def _equalization_case() -> tuple[list[torch.Tensor], torch.Tensor]:
    """Two consumers of 80 channels (a partial second block) with two outlier channels."""
    generator = torch.Generator().manual_seed(1)
    weights = [
        torch.randn(96, 80, generator=generator) * 0.05,
        torch.randn(40, 80, generator=generator) * 0.05,
    ]
    moment = torch.rand(80, generator=generator) ** 4 * 10
    moment[[3, 50]] = 400.0
    return weights, moment


@pytest.mark.parametrize("scale_limit", [16.0, 2.0])
def test_equalization_choice_matches_seed(scale_limit: float) -> None:
    weights, moment = _equalization_case()
    choice = gptq.choose_equalization_scale(weights, moment, 64, scale_limit)
    alpha, scale, objective, baseline = seed_reference.choose_equalization(
        weights, moment, 64, scale_limit
    )
    assert choice.alpha == alpha
    assert torch.equal(choice.scale, scale)
    assert choice.objective == objective
    assert choice.baseline == baseline
    assert float(choice.scale.max()) <= scale_limit and float(choice.scale.min()) >= 1 / scale_limit


def test_identity_candidate_keeps_a_winning_alpha() -> None:
    weights, moment = _equalization_case()
    plain = gptq.choose_equalization_scale(weights, moment)
    with_identity = gptq.choose_equalization_scale(weights, moment, include_identity=True)
    assert plain.objective < plain.baseline
    assert with_identity.alpha == plain.alpha == 0.25
    assert torch.equal(with_identity.scale, plain.scale)


def test_identity_candidate_wins_when_every_alpha_is_worse() -> None:
    # Weights already on the grid: no scaling, no error; the seed still scales them.
    weights, moment = _equalization_case()
    weights = [f143.quantize_nearest(weight) for weight in weights]
    seed_alpha, seed_scale, seed_objective, seed_baseline = seed_reference.choose_equalization(
        weights, moment, 64, 16.0
    )
    plain = gptq.choose_equalization_scale(weights, moment)
    assert (plain.alpha, plain.objective, plain.baseline) == (seed_alpha, seed_objective, 0.0)
    assert torch.equal(plain.scale, seed_scale) and plain.objective > 0.0
    choice = gptq.choose_equalization_scale(weights, moment, include_identity=True)
    assert choice.alpha is None
    assert torch.equal(choice.scale, torch.ones(80))
    assert choice.objective == choice.baseline == 0.0


def test_equalization_checks_arguments() -> None:
    weights, moment = _equalization_case()
    with pytest.raises(ValueError, match="scale_limit must be at least 1, got 0.5"):
        gptq.choose_equalization_scale(weights, moment, scale_limit=0.5)
    with pytest.raises(ValueError, match="no equalization candidate"):
        gptq.choose_equalization_scale(weights, moment, alphas=())


def test_fold_scale_preserves_layernorm_consumer_output() -> None:
    weights, moment = _equalization_case()
    generator = torch.Generator().manual_seed(2)
    norm = torch.nn.LayerNorm(80)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(80, generator=generator))
        norm.bias.copy_(0.1 * torch.randn(80, generator=generator))
    scale = gptq.choose_equalization_scale(weights, moment).scale
    norm_weight, norm_bias, folded = gptq.fold_scale(norm.weight, norm.bias, weights, scale)
    assert torch.equal(norm_weight, norm.weight / scale)
    assert torch.equal(folded[1], weights[1] * scale)
    inputs = torch.randn(16, 80, generator=generator)
    normalised = torch.nn.functional.layer_norm(inputs, (80,), norm_weight, norm_bias)
    for weight, scaled in zip(weights, folded):
        expected = norm(inputs) @ weight.T
        torch.testing.assert_close(normalised @ scaled.T, expected, rtol=1e-5, atol=1e-5)
