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
# The most resample indices drawn at once (32 MiB of int64).
BOOTSTRAP_ELEMENTS = 1 << 22


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


def spread(outputs: "numpy.ndarray", floor: float = 0.0) -> float:
    """How much an output varies across samples, relative to its size: the root mean
    square distance of each sample's output (row of ``[samples, ...]``, flattened) from
    their mean, over the root mean square norm of the outputs (or ``floor``, where that is
    larger: an output that vanishes has no size to vary against), in float64. 0 when
    every sample gives the same output (a model that ignores its input), about 1 when
    outputs are independent of each other; 0 for outputs that are all zero."""
    import numpy

    rows = outputs.reshape(len(outputs), -1).astype(numpy.float64)
    size = max(float(numpy.sqrt((rows ** 2).sum(axis=1).mean())), floor)
    if size == 0 or not numpy.isfinite(size):
        return 0.0 if size == 0 else float("nan")
    return float(numpy.sqrt(((rows - rows.mean(axis=0)) ** 2).sum(axis=1).mean()) / size)


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
    series = {name: numpy.asarray(values, dtype=numpy.float64) for name, values in per_sample.items()}
    means: dict[str, list["numpy.ndarray"]] = {name: [] for name in series}
    generator = numpy.random.default_rng(seed)
    # Drawn a block of resamples at a time, in bounded memory (1,797 samples x 100,000
    # resamples at once was 1.4 GB of indices): the same draws, one stream, as at once.
    rows = max(1, BOOTSTRAP_ELEMENTS // count)
    for start in range(0, resamples, rows):
        indices = generator.integers(0, count, size=(min(rows, resamples - start), count))
        for name, values in series.items():
            means[name].append(values[indices].mean(axis=1))
    tail = (1 - CONFIDENCE) / 2
    found = {}
    for name, values in series.items():
        low, high = numpy.quantile(numpy.concatenate(means[name]), [tail, 1 - tail])
        found[name] = Interval(float(values.mean()), float(low), float(high))
    return found
