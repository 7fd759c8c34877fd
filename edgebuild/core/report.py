"""Verification checks -> ``report.json`` and ``report.md``.

A check is a measured value, a limit and a comparison. Verification collects
every check, then fails once, naming each failed one with its numbers.

``report.json`` holds ``format``, ``artifact``, ``kind``, ``fingerprint`` (the build
judged), ``verify_fingerprint`` (the build's, the thresholds' and the judging code's:
a report counts only at the current one), ``passed``, ``checks`` (each ``name``,
``value``, ``limit``, ``comparison``, ``passed``, and an optional ``detail``),
``metrics`` (what the kind measured beyond its checks), ``build`` (what the build
recorded of itself) and ``verify`` (the manifest's ``verify:`` settings it was judged
with) and ``judged_on`` (``{held_out, dataset, random_only}``: the held-out inputs along
its chain and the dataset it was judged on, as words, ``null`` where none; ``random_only``
where neither, which ``report.md``'s headline says). Beside them, what verification
along the chain adds (``edgebuild/run/chain.py``):
``chain`` (each artifact it is made from, with its verdict), ``dataset`` (a gate's
intervals) and ``latency``: the artifact's time here, ``{measured, n, median_ms,
median_ci95_ms, p90_ms, noisy, runs, warmup, runtime, threads, machine: {cpu, cores,
threads?}, load: {before, after}, float_source?: {artifact, n, median_ms, median_ci95_ms,
p90_ms, noisy, threads}, ratio?, ratio_ci95?, ratio_not_stated?, simulated}``
(milliseconds; the median's 95% interval by order statistics, ``null`` below 6 runs; the
p90 by nearest rank; ``noisy`` where that interval is wider than a quarter of the median;
``threads`` each side was held to, ``null`` where its runtime chose; ``load`` the
one-minute load average; ``ratio`` the artifact's median over its float source's, timed in
turn, with its interval, or ``null`` and ``ratio_not_stated`` saying why: noisy, or not
run alike; ``edgebuild/run/latency.py``), or ``{measured: false, reason}`` where it does
not run here, with ``simulated: true`` where it runs on a simulator of the device (the QNN
HTP simulator), which is not timed.
``report.md`` is the same checks as a table. A check may also carry ``order``: the values
its comparison ranks, least first (``level``: ``["none", "loaded", "ran"]``).

A verdict is never taken from the file: :func:`verdict_problem` re-derives every check's
``passed`` from its value, comparison and limit (:func:`holds`), and the report's from its
checks; a report they disagree with counts as not verified. The build record seals the
report files' digests when verification writes them (``edgebuild/core/record.py``), so an
edited value is refused as well.

``coverage``, where a certificate was computed (docs/concepts/coverage.md), maps each
target (as the artifact's kind's formats name it) to its certificate: ``target``,
``tool`` and ``tool_version`` (what answered),
``assumption`` (the architecture, feature level or static table assumed),
``nodes_total``, ``nodes_taken``, ``fraction``, ``partitions`` and ``fallbacks`` (every
node the target does not take: ``node``, ``op_type`` and ``module``, the model module it
was exported from, each ``null`` where the tool does not say), and ``as_built``
(``{nodes_total, nodes_taken, partitions}`` on the graph as built, where the tool counts a
rewritten one: the usability checker's certificates count after onnxruntime's basic
optimizations, as it does). A target asked for whose
certificate could not be computed is named, with the reason, in
``metrics.coverage_not_computed``.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgebuild.core.atomic import write_text
from edgebuild.core.files import REPORT_BYTES, UnreadableFile, read_json
from edgebuild.core.record import read_record_or_none

REPORT_FORMAT = 1
REPORT_JSON = "report.json"
REPORT_MD = "report.md"

Comparison = Literal[">=", "<=", "=="]
# The headline's warning for an artifact no data was declared for.
RANDOM_ONLY = ("**Judged on random inputs only**: no held-out inputs along its chain and no dataset gate. A model "
               "can pass on noise and fail on data; declare `held_out` or `verify: {dataset: ...}` "
               "(docs/concepts/verification.md).")


def holds(value: Any, comparison: str, limit: Any, order: "tuple[Any, ...] | list[Any] | None" = None) -> bool:
    """Whether ``value comparison limit`` holds: the one rule a check's verdict follows,
    when it is measured and when a report is read again. Numbers compare as numbers (a NaN
    never holds), ranked values by their place in ``order``, anything else only by ``==``;
    a comparison it cannot decide does not hold."""
    if order is not None:
        order = list(order)
        if value not in order or limit not in order:
            return False
        value, limit = order.index(value), order.index(limit)
    if _is_number(value) and math.isnan(value):
        return False
    if comparison == "==":
        return bool(value == limit)
    if not (_is_number(value) and _is_number(limit)):
        return False
    if comparison == ">=":
        return bool(value >= limit)
    if comparison == "<=":
        return bool(value <= limit)
    return False


def _is_number(value: Any) -> bool:
    # numbers.Real takes numpy's scalars too; a bool is a yes or no, not a number.
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Check:
    name: str
    value: Any
    limit: Any
    comparison: Comparison
    passed: bool
    detail: str = ""
    # The values ``value`` and ``limit`` rank among, least first, where they are not numbers.
    order: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        # A pass its own numbers do not support would be refused when the report is read
        # (verdict_problem): say so where it is made instead.
        if self.passed and not holds(self.value, self.comparison, self.limit, self.order):
            raise ValueError(f"check {self.name!r} cannot pass: {self.value!r} {self.comparison} {self.limit!r} does not hold")

    @classmethod
    def measure(cls, name: str, value: Any, comparison: Comparison, limit: Any, detail: str = "",
                order: tuple[Any, ...] | None = None) -> "Check":
        """A check whose verdict is computed here (:func:`holds`), so a NaN never passes."""
        return cls(name, value, limit, comparison, holds(value, comparison, limit, order), detail, order)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Check":
        """A check as a report holds it, its verdict re-derived (:func:`holds`), not read."""
        order = data.get("order")
        order = tuple(order) if isinstance(order, list) else None
        return cls.measure(data["name"], data["value"], data["comparison"], data["limit"], data.get("detail", ""), order)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.order is None:
            del data["order"]
        else:
            data["order"] = list(self.order)
        return data

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
            "checks": [check.to_json() for check in self.checks],
            "metrics": self.metrics,
            "build": self.build,
        } | self.extra

    def summary(self) -> str:
        lines = [
            f"# {self.artifact} ({self.kind}): {'PASSED' if self.passed else 'FAILED'}",
            "",
            *([RANDOM_ONLY, ""] if (self.extra.get("judged_on") or {}).get("random_only") else []),
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
        """Write both files atomically (a reader sees the old report or the new one), then
        seal them in the build record there (:meth:`BuildRecord.sealing_reports`): a report
        edited after this is refused, never trusted (``edgebuild/run/state.py``)."""
        write_text(directory / REPORT_JSON, json.dumps(self.to_json(), indent=2, default=_jsonable) + "\n")
        write_text(directory / REPORT_MD, self.summary())
        record = read_record_or_none(directory)
        if record is not None:
            record.sealing_reports(directory).write(directory)


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


def verdict_problem(report: dict[str, Any]) -> str | None:
    """Why ``report``'s verdict is not what its own checks say (one line); ``None`` when
    every check's ``passed`` follows from its value, comparison and limit and the
    report's ``passed`` from its checks. A report is read from a file anyone can edit:
    its verdict is re-derived here, never taken as written."""
    checks = report.get("checks")
    if not isinstance(checks, list):
        return "it holds no list of checks"
    derived = []
    for position, check in enumerate(checks):
        if not isinstance(check, dict) or not {"name", "value", "limit", "comparison", "passed"} <= check.keys():
            return f"check {position + 1} is not a check (name, value, limit, comparison, passed)"
        order = check.get("order")
        held = holds(check["value"], check["comparison"], check["limit"], order if isinstance(order, list) else None)
        if check["passed"] is not held:
            said = "passed" if check["passed"] is True else "failed"
            return (f"check {check['name']} says it {said}, but {format_number(check['value'])} "
                    f"{check['comparison']} {format_number(check['limit'])} {'holds' if held else 'does not hold'}")
        derived.append(held)
    passed = bool(derived) and all(derived)
    if report.get("passed") is not passed:
        return f"it says passed: {json.dumps(report.get('passed'))}, but its checks say {json.dumps(passed)}"
    return None


def report_passed(report: dict[str, Any] | None) -> bool:
    """Whether ``report`` passed, as its checks say (:func:`verdict_problem`): a report
    whose verdict does not follow from its checks did not."""
    return report is not None and verdict_problem(report) is None and report.get("passed") is True


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
