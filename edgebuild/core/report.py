"""Verification checks -> ``report.json`` and ``report.md``.

A check is a measured value, a limit and a comparison. Verification collects
every check, then fails once, naming each failed one with its numbers.

``report.json`` holds ``format``, ``artifact``, ``kind``, ``fingerprint`` (the build
judged), ``verify_fingerprint`` (the build's, the thresholds' and the judging code's:
a report counts only at the current one), ``passed``, ``checks`` (each ``name``,
``value``, ``limit``, ``comparison``, ``passed``, and an optional ``detail``),
``metrics`` (what the kind measured beyond its checks), ``build`` (what the build
recorded of itself) and ``verify`` (the manifest's ``verify:`` settings it was judged
with). Beside them, what verification along the chain adds (``edgebuild/run/chain.py``):
``chain`` (each artifact it is made from, with its verdict), ``dataset`` (a gate's
intervals) and ``latency``: the artifact's time here, ``{measured, median_ms, p90_ms,
runs, warmup, runtime, machine: {cpu, cores, threads?}, float_source?: {artifact,
median_ms, p90_ms}, ratio?, simulated}`` (milliseconds; the p90 by nearest rank; ``ratio``
the artifact's median over its float source's, timed in turn), or ``{measured: false,
reason}`` where it does not run here, with ``simulated: true`` where it runs on a
simulator of the device (the QNN HTP simulator), which is not timed.
``report.md`` is the same checks as a table.

``coverage``, where a certificate was computed (docs/concepts/coverage.md), maps each
target (as the artifact's kind's formats name it) to its certificate: ``target``,
``tool`` and ``tool_version`` (what answered),
``assumption`` (the architecture, feature level or static table assumed),
``nodes_total``, ``nodes_taken``, ``fraction``, ``partitions`` and ``fallbacks`` (every
node the target does not take: ``node``, ``op_type`` and ``module``, the model module it
was exported from, each ``null`` where the tool does not say). A target asked for whose
certificate could not be computed is named, with the reason, in
``metrics.coverage_not_computed``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgebuild.core.atomic import write_text
from edgebuild.core.files import REPORT_BYTES, UnreadableFile, read_json

REPORT_FORMAT = 1
REPORT_JSON = "report.json"
REPORT_MD = "report.md"

Comparison = Literal[">=", "<=", "=="]


@dataclass(frozen=True)
class Check:
    name: str
    value: Any
    limit: Any
    comparison: Comparison
    passed: bool
    detail: str = ""

    @classmethod
    def measure(cls, name: str, value: Any, comparison: Comparison, limit: Any, detail: str = "") -> "Check":
        """A check whose verdict is computed here, so a NaN never passes."""
        if isinstance(value, float) and math.isnan(value):
            passed = False
        elif comparison == ">=":
            passed = value >= limit
        elif comparison == "<=":
            passed = value <= limit
        else:
            passed = value == limit
        return cls(name, value, limit, comparison, bool(passed), detail)

    def describe(self) -> str:
        return f"{self.name} = {format_number(self.value)} (limit {self.comparison} {format_number(self.limit)})" + (
            f": {self.detail}" if self.detail else ""
        )


@dataclass
class Report:
    artifact: str
    kind: str
    fingerprint: str
    checks: list[Check]
    metrics: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    # Bookkeeping kept beside the checks (the verification fingerprint, the thresholds used).
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "artifact": self.artifact,
            "kind": self.kind,
            "fingerprint": self.fingerprint,
            "passed": self.passed,
            "checks": [asdict(check) for check in self.checks],
            "metrics": self.metrics,
            "build": self.build,
        } | self.extra

    def summary(self) -> str:
        lines = [
            f"# {self.artifact} ({self.kind}): {'PASSED' if self.passed else 'FAILED'}",
            "",
            f"fingerprint `{self.fingerprint}`",
            "",
            "| check | value | limit | result |",
            "| --- | --- | --- | --- |",
        ]
        for check in self.checks:
            lines.append(
                f"| {check.name} | {format_number(check.value)} | {check.comparison} {format_number(check.limit)} | "
                f"{'pass' if check.passed else '**FAIL**'} |"
            )
        if not self.checks:
            lines.append("| (no checks ran) | | | **FAIL** |")
        return "\n".join(lines) + "\n"

    def write(self, directory: Path) -> None:
        """Write both files atomically: a reader sees the old report or the new one."""
        write_text(directory / REPORT_JSON, json.dumps(self.to_json(), indent=2, default=_jsonable) + "\n")
        write_text(directory / REPORT_MD, self.summary())


def read_report(directory: Path) -> dict[str, Any] | None:
    """The report in ``directory``; ``None`` when there is none, or none this edgebuild
    can read (not a regular file, too large, not JSON of bounded depth, another format):
    an artifact whose report cannot be read counts as not verified."""
    return read_report_file(directory / REPORT_JSON)


def read_report_file(path: Path) -> dict[str, Any] | None:
    """:func:`read_report` of the file ``path`` (a stored report is a blob, named by its digest)."""
    try:
        data = read_json(path, REPORT_BYTES)
    except (OSError, UnreadableFile):
        return None
    return data if isinstance(data, dict) and data.get("format") == REPORT_FORMAT else None


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def format_number(value: Any) -> str:
    """A measured number as reports print it: cosines to 8 digits, small and large values in
    scientific notation."""
    if isinstance(value, float):
        if 0.99 <= abs(value) < 1:
            # Cosines: 0.99999997 must not print as 1.
            return f"{value:.8f}"
        if value == 0 or 1e-3 <= abs(value) < 1e5:
            return f"{value:.6g}"
        return f"{value:.3e}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_number(item) for item in value) + "]"
    return str(value)
