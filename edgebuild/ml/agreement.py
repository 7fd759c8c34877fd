"""An output against its reference, judged: the metrics of ``compare.py`` plus the error
relative to the output's scale (``max_rel`` = max |out - ref| / max |ref|), whether the
reference is constant (then a cosine, or an error relative to a scale of zero, says
nothing), and the checks that limits make of them.

Verification only: ``compare.py`` is also in builds' code (a quantizer reports its
error), and this module is not, so that changing how outputs are judged re-verifies
and rebuilds nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebuild.core.report import Check, format_number
from edgebuild.ml.compare import compare_outputs, worst_case

if TYPE_CHECKING:
    import torch

    from edgebuild.core.thresholds import OutputLimits


def agreement(reference: "torch.Tensor", actual: "torch.Tensor") -> dict[str, Any]:
    """:func:`~edgebuild.ml.compare.compare_outputs` with ``max_rel``, ``reference_max_abs``
    and ``reference_constant`` (the value, when every element of the reference is the same)."""
    metrics: dict[str, Any] = compare_outputs(reference, actual)
    scale = reference.double().abs().max().item()
    metrics["reference_max_abs"] = scale
    metrics["max_rel"] = _relative(metrics["max_abs"], scale)
    first = reference.reshape(-1)[0].item() if reference.numel() else 0.0
    metrics["reference_constant"] = first if bool((reference == first).all()) else None
    return metrics


def worst_agreement(comparisons: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`~edgebuild.ml.compare.worst_case` over comparisons made by :func:`agreement`:
    ``max_rel`` over all of them (the largest error over the largest reference), and the
    reference's constant value only when every comparison's is the same one."""
    if not comparisons:
        return {}
    worst: dict[str, Any] = worst_case(comparisons)
    scale = max(item["reference_max_abs"] for item in comparisons)
    worst["reference_max_abs"] = scale
    worst["max_rel"] = _relative(worst["max_abs"], scale)
    constants = {item["reference_constant"] for item in comparisons}
    worst["reference_constant"] = constants.pop() if len(constants) == 1 else None
    return worst


def _relative(error: float, scale: float) -> float | None:
    """``error / scale``; ``None`` for an error against a reference of zeros (no scale)."""
    if scale > 0:
        return error / scale
    return 0.0 if error == 0 else None


def output_checks(prefix: str, measured: dict[str, Any], limits: "OutputLimits", note: str) -> list[Check]:
    """The checks ``limits`` make of one output's ``measured`` agreement (from
    :func:`worst_agreement`), named ``<prefix>.<metric>``; unset limits are not checked.

    A constant reference (a model whose output is all zeros) has no direction for a
    cosine and, at zero, no scale for ``max_rel``: those are not computed, the output is
    judged by ``max_abs`` when one is set, and otherwise one failing check says so."""
    constant = measured.get("reference_constant")
    if constant is not None:
        said = f"the reference {prefix.rsplit('.', 1)[-1]} is constant (every element {format_number(constant)})"
        if limits.max_abs is None and (limits.max_rel is None or constant == 0):
            return [Check(f"{prefix}.reference", "constant", "varying", "==", False,
                          f"{said}: its cosine and relative error say nothing; set max_abs for this output to judge it")]
        checks = []
        if limits.max_abs is not None:
            checks.append(Check.measure(f"{prefix}.max_abs", measured["max_abs"], "<=", limits.max_abs, f"{said}; {note}"))
        if limits.max_rel is not None and constant != 0:
            checks.append(Check.measure(f"{prefix}.max_rel", measured["max_rel"], "<=", limits.max_rel, f"{said}; {note}"))
        return checks
    checks = []
    if limits.cosine_min is not None:
        checks.append(Check.measure(f"{prefix}.cosine", measured["cosine"], ">=", limits.cosine_min, note))
    for key, limit in (("max_rel", limits.max_rel), ("max_abs", limits.max_abs), ("mean_abs", limits.mean_abs)):
        if limit is not None:
            checks.append(Check.measure(f"{prefix}.{key}", measured[key], "<=", limit, note))
    return checks
