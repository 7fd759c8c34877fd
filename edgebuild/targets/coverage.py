"""Coverage certificates: which nodes of an artifact's graph a target takes, known on
this machine before any device runs it; and the gates on one.

A certificate names its target, the tool that answered and its version, what was
assumed (an architecture, a feature level, a static table), the nodes in all and the
nodes taken, the partitions the taken nodes form, and every node that falls back, with
its op type and the model module it came from (from the exporter's node metadata:
torch's ONNX exporter writes ``pkg.torch.onnx.name_scopes``, so ``node_Conv_154`` reads
as ``embeddings.patch_embedding``).

Each target answers for itself: a format declares the targets its files can be asked
about (:class:`~edgebuild.core.kind.CoverageTarget`, ``Format.certificates``), with the
function that computes the certificate (the ONNX graph's in ``onnx_graph.py``, a target
kind's in its own package). Nothing here names a target.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from edgebuild.core.kind import CoverageTarget
from edgebuild.core.report import Check
from edgebuild.core.thresholds import CoverageGate
from edgebuild.ml.modules import describe_fallbacks


@dataclass
class Certificate:
    """What one target takes of one artifact's graph."""

    target: str
    tool: str
    tool_version: str
    assumption: str
    nodes_total: int
    nodes_taken: int
    partitions: int
    # Every node the target does not take: {node, op_type, module} (node or module None
    # where the tool does not say).
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    # The same count on another form of the graph, where the tool counts on a rewritten one
    # (the usability checker optimizes first): {nodes_total, nodes_taken, partitions}.
    as_built: dict[str, int] | None = None

    @property
    def fraction(self) -> float:
        return self.nodes_taken / self.nodes_total if self.nodes_total else 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"fraction": round(self.fraction, 6)}


def package_version(package: str) -> str:
    """An installed distribution's version (``not installed`` where there is none)."""
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def certify(target: CoverageTarget, directory: Path, memo: dict[str, Any]) -> Certificate:
    """``target``'s certificate of the built ``directory`` (its ``certify`` function);
    ``LookupError`` saying why when the artifact holds nothing the target can be asked about."""
    module, _, function = target.certify.partition(":")
    found = getattr(importlib.import_module(module), function)(directory, memo)
    if not isinstance(found, Certificate):
        raise TypeError(f"{target.certify} returned {type(found).__name__}, not a Certificate")
    return found


def gate_checks(target: str, found: Certificate, gate: CoverageGate) -> list[Check]:
    """The checks of one target's gates against its certificate (``coverage.<target>.<gate>``)."""
    checks = []
    summary = f"{found.nodes_taken} of {found.nodes_total} nodes on {target} ({found.tool} {found.tool_version})"
    falls = f"; falls back: {describe_fallbacks(found.fallbacks)}" if found.fallbacks else ""
    if gate.min_fraction is not None:
        checks.append(Check.measure(f"coverage.{target}.fraction", round(found.fraction, 6), ">=", gate.min_fraction,
                                    summary + falls))
    if gate.max_partitions is not None:
        checks.append(Check.measure(f"coverage.{target}.partitions", found.partitions, "<=", gate.max_partitions,
                                    f"{summary}, in {found.partitions} partition(s){falls}"))
    if gate.never_on_cpu:
        barred = set(gate.never_on_cpu)
        fallen = [entry for entry in found.fallbacks if entry.get("op_type") in barred]
        detail = (f"falls back: {describe_fallbacks(fallen)}" if fallen
                  else f"no {', '.join(sorted(barred))} node falls back")
        checks.append(Check.measure(f"coverage.{target}.never_on_cpu", len(fallen), "==", 0, detail))
    return checks
