"""Coverage in verification: the certificates of the targets an artifact is meant for
(its kind's ``coverage_targets``, or ``verify: {coverage: {targets: [...]}}``, plus every
gated target), computed from its built files (``edgebuild/ml/coverage.py``), and the
gates on them (``verify: {coverage: {TARGET: {min_fraction, max_partitions,
never_on_cpu}}}``) as checks named ``coverage.<target>.<gate>``.

Part of the judging code: editing this module or the certificates' re-verifies every
artifact, and rebuilds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.core.report import Check
from edgebuild.core.thresholds import CoverageGate, coverage_settings, coverage_targets
from edgebuild.ml.coverage import ONNX_TARGETS, Certificate, openvino_certificate, qnn_certificate, xnnpack_certificate
from edgebuild.ml.modules import describe_fallbacks, load_graph

if TYPE_CHECKING:
    from edgebuild.core.kind import ArtifactKind, ArtifactParams

# What the kinds that record a placement at build time call the record.
EXECUTORCH_INFO = "executorch.json"
OPENVINO_INFO = "openvino.json"
QNN_INFO = "context.json"


@dataclass
class Coverage:
    checks: list[Check] = field(default_factory=list)
    certificates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Targets asked for whose certificate could not be computed, and why.
    missing: dict[str, str] = field(default_factory=dict)


def certificate(target: str, kind: "ArtifactKind", directory: Path, graphs: dict[Path, Any]) -> Certificate:
    """The certificate of ``target`` for the built ``directory``; ``LookupError`` saying why
    when the artifact has nothing that target can be asked about."""
    def output(suffix: str) -> Path:
        found = next((name for name in kind.outputs if name.endswith(suffix)), None)
        if found is None:
            raise LookupError(f"a {kind.name} artifact has no {suffix} file for {target} to read")
        return directory / found

    if target in ONNX_TARGETS:
        path = output(".onnx")
        if path not in graphs:
            graphs[path] = load_graph(path)
        return ONNX_TARGETS[target](graphs[path])
    if target == "openvino_cpu":
        modules = read_json(output(OPENVINO_INFO), RECORD_BYTES).get("modules") if OPENVINO_INFO in kind.outputs else None
        return openvino_certificate(output(".xml"), "CPU", modules if isinstance(modules, dict) else None)
    if target == "xnnpack":
        info = read_json(output(EXECUTORCH_INFO), RECORD_BYTES)
        if info.get("delegate") != "xnnpack":
            raise LookupError(f"the program was lowered for {info.get('delegate')!r}, not xnnpack")
        return xnnpack_certificate(info)
    if target == "qnn_htp":
        return qnn_certificate(read_json(output(QNN_INFO), RECORD_BYTES))
    raise LookupError(f"no certificate is known for target {target!r}")


def judge_coverage(kind: "ArtifactKind", params: "ArtifactParams", directory: Path,
                   log: Callable[[str], None] = print) -> Coverage:
    """The certificates of ``directory``'s targets and the checks of their gates."""
    result = Coverage()
    gates = coverage_settings(params).gates()
    graphs: dict[Path, Any] = {}
    computed: dict[str, Certificate] = {}
    for target in coverage_targets(kind, params):
        try:
            found = certificate(target, kind, directory, graphs)
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
    for target, gate in gates.items():
        if target not in computed:
            reason = result.missing.get(target, "not computed")
            result.checks.append(Check.measure(f"coverage.{target}.certificate", "missing", "==", "computed", reason))
            continue
        result.checks.extend(gate_checks(target, computed[target], gate))
    return result


def gate_checks(target: str, found: Certificate, gate: CoverageGate) -> list[Check]:
    """The checks of one target's gates against its certificate."""
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
