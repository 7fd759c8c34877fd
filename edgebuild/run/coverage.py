"""Coverage in verification: the certificates of the targets an artifact is meant for
(its kind's ``coverage_targets``, or ``verify: {coverage: {targets: [...]}}``, plus every
gated target), each computed by the target's own code from the built files (its
format's declaration: ``edgebuild/targets/coverage.py``), and the gates on them
(``verify: {coverage: {TARGET: {min_fraction, max_partitions, never_on_cpu}}}``) as
checks named ``coverage.<target>.<gate>``.

Part of the judging code: editing this module or a target's certificate re-verifies the
artifacts it certifies, and rebuilds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.report import Check
from edgebuild.core.thresholds import coverage_settings, coverage_targets
from edgebuild.targets.coverage import Certificate, certify, gate_checks

if TYPE_CHECKING:
    from edgebuild.core.kind import ArtifactKind, ArtifactParams


@dataclass
class Coverage:
    checks: list[Check] = field(default_factory=list)
    certificates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Targets asked for whose certificate could not be computed, and why.
    missing: dict[str, str] = field(default_factory=dict)


def judge_coverage(kind: "ArtifactKind[Any]", params: "ArtifactParams", directory: Path,
                   log: Callable[[str], None] = print) -> Coverage:
    """The certificates of ``directory``'s targets and the checks of their gates."""
    result = Coverage()
    gates = coverage_settings(params).gates()
    known = kind.certificates()
    memo: dict[str, Any] = {}
    computed: dict[str, Certificate] = {}
    certified = coverage_targets(kind, params)  # every gated target among them, in the kind's order
    for target in certified:
        if target not in known:
            result.missing[target] = (f"a {kind.name} artifact has no certificate for {target!r} "
                                      f"(its targets: {', '.join(known) or 'none'})")
            continue
        try:
            found = certify(known[target], directory, memo)
        except LookupError as error:
            result.missing[target] = str(error)
            continue
        except Exception as error:  # a tool that fails on this graph: said, and gated as missing
            result.missing[target] = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            log(f"coverage {target}: not computed: {result.missing[target]}")
            continue
        computed[target] = found
        result.certificates[target] = found.to_dict()
        log(f"coverage {target}: {found.nodes_taken} of {found.nodes_total} nodes in {found.partitions} partition(s)")
    for target in certified:
        gate = gates.get(target)
        if gate is None:
            continue
        if target not in computed:
            reason = result.missing.get(target, "not computed")
            result.checks.append(Check.measure(f"coverage.{target}.certificate", "missing", "==", "computed", reason))
            continue
        result.checks.extend(gate_checks(target, computed[target], gate))
    return result
