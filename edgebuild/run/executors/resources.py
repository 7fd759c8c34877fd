"""What one artifact's task needs from a cluster worker, as worker resources.

``MEMORY`` (bytes) is the larger of

- an estimate from the weights and the kind: a process's own footprint (Python,
  torch, transformers, onnxruntime imported) plus the kind's ``memory_factor`` times
  the float32 size of the tensors the artifact reads (or, for one that reads none,
  of those its nearest source read). The factors are the measured peaks over the
  weights in BENCHMARKS.md, rounded up; the build and its verification each run
  in a process of their own, so the larger of the two counts, not their sum;
- the recorded peak of its last build (``edgebuild/costs.py``), plus a margin.

``GPU`` (1) when the artifact asks for ``device: cuda``.

Dask counts resources per worker while a task runs, so a worker started with
``--resources "MEMORY=64e9"`` runs as many tasks at once as their estimates fit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgebuild.core.project import Artifact
    from edgebuild.run.costs import Cost

MEMORY = "MEMORY"
GPU = "GPU"
# A worker process before it loads any weights: the interpreter with torch, transformers and
# onnxruntime imported (measured: 0.46 GiB peak for a whole tiny-tower build).
PROCESS_FOOTPRINT_BYTES = 1 << 30
# A kind that declares no ``memory_factor`` (its peak over its float32 weights, measured).
UNMEASURED_KIND_FACTOR = 3.0
# Over a recorded peak: another run of the same build allocates a little differently.
RECORDED_PEAK_MARGIN = 1.25
BYTES_PER_FLOAT32 = 4


def task_resources(artifact: "Artifact", cost: "Cost | None") -> tuple[dict[str, float], str]:
    """The resources ``artifact``'s task asks for, and how ``MEMORY`` was arrived at (for messages)."""
    weights = float32_weight_bytes(artifact)
    factor = artifact.kind.process.memory_factor or UNMEASURED_KIND_FACTOR
    memory = PROCESS_FOOTPRINT_BYTES + factor * weights
    basis = f"estimated: {_gib(PROCESS_FOOTPRINT_BYTES)} + {factor:g} x {_gib(weights)} of float32 weights"
    if cost is not None and cost.peak_rss_bytes and cost.peak_rss_bytes * RECORDED_PEAK_MARGIN > memory:
        memory = cost.peak_rss_bytes * RECORDED_PEAK_MARGIN
        basis = f"recorded peak {_gib(cost.peak_rss_bytes)} in the {cost.source}, plus {RECORDED_PEAK_MARGIN - 1:.0%}"
    resources = {MEMORY: float(int(memory))}
    if getattr(artifact.params, "device", None) == "cuda":
        resources[GPU] = 1.0
    return resources, basis


def float32_weight_bytes(artifact: "Artifact") -> int:
    """The float32 size of the tensors ``artifact`` reads from its checkpoints; for one that
    reads none (a graph made from its source's), its nearest source's."""
    project = artifact.project
    params = artifact.params
    kind = artifact.kind
    # Its own checkpoints; an artifact without one reads those behind its sources.
    checkpoints = [project.checkpoint(checkpoint) for checkpoint in params.checkpoint_names()]
    if not checkpoints:
        checkpoints = list(project.checkpoints_for(params).values())
    elements = 0
    for checkpoint in checkpoints:
        selection = kind.tensor_selection(params, checkpoint)
        if selection is None or not selection.prefixes:
            continue
        elements += sum(math.prod(entry.shape) for entry in checkpoint.select(selection.prefixes).values())
    if elements:
        return elements * BYTES_PER_FLOAT32
    return max((float32_weight_bytes(source) for source in artifact.sources), default=0)


def _gib(size: float) -> str:
    return f"{size / 2**30:.2f} GiB"


def describe(resources: dict[str, float]) -> str:
    return ", ".join(f"{key}={value:.3g}" for key, value in sorted(resources.items()))
