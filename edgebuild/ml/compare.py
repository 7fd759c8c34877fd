"""Comparing a model's outputs with a reference: one set of metrics, one set of names.

``cosine`` is the cosine similarity of each sample's flattened output with its
reference (dimension 0 indexes samples), averaged over the samples;
``min_row_cosine`` is the worst cosine of any single row (a token's vector) of
any sample; ``max_abs`` and ``mean_abs`` are the absolute error's maximum and
mean. Computed in float64, so that the metric's own rounding never decides a
threshold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

METRICS = ("cosine", "min_row_cosine", "max_abs", "mean_abs")


def compare_outputs(reference: "torch.Tensor", actual: "torch.Tensor") -> dict[str, float]:
    """Metrics of ``actual`` against ``reference`` (same shape, ``[samples, ...]``)."""
    import torch

    if reference.shape != actual.shape:
        raise ValueError(f"cannot compare outputs of shapes {tuple(actual.shape)} and {tuple(reference.shape)}")
    reference, actual = reference.double(), actual.double()
    samples = reference.shape[0]
    error = (actual - reference).abs()
    flat_cosine = torch.nn.functional.cosine_similarity(actual.reshape(samples, -1), reference.reshape(samples, -1), dim=1)
    row_cosine = torch.nn.functional.cosine_similarity(actual, reference, dim=-1)
    return {
        "cosine": flat_cosine.mean().item(),
        "min_row_cosine": row_cosine.min().item(),
        "max_abs": error.max().item(),
        "mean_abs": error.mean().item(),
    }


def worst_case(comparisons: list[dict[str, float]]) -> dict[str, float]:
    """Over several comparisons (batches): the lowest cosines, the largest maximum
    error, the mean of the mean errors. Empty for none."""
    if not comparisons:
        return {}
    return {
        "cosine": min(item["cosine"] for item in comparisons),
        "min_row_cosine": min(item["min_row_cosine"] for item in comparisons),
        "max_abs": max(item["max_abs"] for item in comparisons),
        "mean_abs": sum(item["mean_abs"] for item in comparisons) / len(comparisons),
    }
