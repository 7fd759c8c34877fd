"""What an artifact loses on data, with confidence: per-sample agreement with the float
model, nearest-neighbour labels in the float model's embedding space, and paired
bootstrap intervals of their means. Pure functions of NumPy arrays; seeded, so the
same inputs give the same numbers on every machine.

Paired: every resample draws one set of sample indices and every metric is the mean
of its per-sample values over those indices, so a difference (an accuracy drop) is
resampled together with the two accuracies it is the difference of.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean and its bootstrap interval (percentile method, ``CONFIDENCE``)."""

    mean: float
    low: float
    high: float

    def to_json(self) -> dict[str, object]:
        return {"mean": self.mean, "ci95": [self.low, self.high]}


def sample_cosines(reference: "numpy.ndarray", actual: "numpy.ndarray") -> "numpy.ndarray":
    """One cosine per sample (row of the ``[samples, ...]`` arrays, flattened), in float64.
    A sample whose reference and output are both zero agrees exactly (1); one where only
    one of them is zero, not at all (0)."""
    import numpy

    reference = reference.reshape(len(reference), -1).astype(numpy.float64)
    actual = actual.reshape(len(actual), -1).astype(numpy.float64)
    norms = numpy.linalg.norm(reference, axis=1) * numpy.linalg.norm(actual, axis=1)
    dots = (reference * actual).sum(axis=1)
    both_zero = (numpy.abs(reference).max(axis=1) == 0) & (numpy.abs(actual).max(axis=1) == 0)
    with numpy.errstate(invalid="ignore", divide="ignore"):
        cosines = numpy.where(norms > 0, dots / numpy.where(norms > 0, norms, 1), 0.0)
    return numpy.where(both_zero, 1.0, cosines)


def embeddings(outputs: "numpy.ndarray") -> "numpy.ndarray":
    """``[samples, ..., features]`` -> ``[samples, features]``: averaged over every axis
    between the first and the last (tokens), as a pooled embedding is."""
    if outputs.ndim <= 2:
        return outputs.reshape(len(outputs), -1)
    return outputs.reshape(len(outputs), -1, outputs.shape[-1]).mean(axis=1)


def nearest_labels(gallery: "numpy.ndarray", labels: "numpy.ndarray", queries: "numpy.ndarray") -> "numpy.ndarray":
    """For each query ``i``, the label of its nearest gallery vector by cosine, leaving out
    gallery vector ``i`` (the same sample): leave-one-out 1-NN in the gallery's space.
    Ties go to the lowest index."""
    import numpy

    def unit(vectors: "numpy.ndarray") -> "numpy.ndarray":
        vectors = vectors.astype(numpy.float64)
        norms = numpy.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / numpy.where(norms > 0, norms, 1)

    similarity = unit(queries) @ unit(gallery).T
    numpy.fill_diagonal(similarity, -numpy.inf)
    return labels[numpy.argmax(similarity, axis=1)]


def bootstrap(per_sample: dict[str, "numpy.ndarray"], resamples: int, seed: int) -> dict[str, Interval]:
    """The mean of each per-sample series and its paired bootstrap interval: ``resamples``
    draws of as many sample indices as there are samples, with replacement, the same
    draws for every series."""
    import numpy

    sizes = {len(values) for values in per_sample.values()}
    if len(sizes) != 1:
        raise ValueError(f"every series needs one value per sample, found lengths {sorted(sizes)}")
    (count,) = sizes
    indices = numpy.random.default_rng(seed).integers(0, count, size=(resamples, count))
    tail = (1 - CONFIDENCE) / 2
    found = {}
    for name, values in per_sample.items():
        values = numpy.asarray(values, dtype=numpy.float64)
        means = values[indices].mean(axis=1)
        low, high = numpy.quantile(means, [tail, 1 - tail])
        found[name] = Interval(float(values.mean()), float(low), float(high))
    return found
