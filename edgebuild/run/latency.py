"""How long an artifact takes to run here, and how that compares with its float source.

Verification (``chain.py``) times the artifact's runner on one evaluation feed: ``warmup``
untimed runs, then up to ``runs`` timed ones (``time.perf_counter``), stopping early once
``budget_s`` seconds are spent but never before 3 timed runs. When the artifact's chain
has a float source (the root's float model: transformers' own forward, or the root float
graph), both are timed in turn, run by run, so that whatever else the machine does
slows both alike; their ratio of medians is what a gate may judge (``latency.ratio``,
opt-in), never an absolute time: a time says as much about the machine as about the
artifact. A simulator (the QNN HTP simulator) is not timed, its time saying nothing
about the device (``chain.py`` records ``simulated: true``), and no gate applies to it.

Pure timing: nothing here reads or writes a file but ``/proc/cpuinfo`` (bounded) for the
machine's description.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.files import UnreadableFile, read_text
from edgebuild.core.report import Check, format_number

if TYPE_CHECKING:
    from edgebuild.core.runner import Feed, Runner
    from edgebuild.core.thresholds import LatencySettings

# Fewest timed runs, whatever the budget: a median of fewer says little.
MIN_RUNS = 3
CHECK_NAME = "latency.ratio"
CPUINFO = Path("/proc/cpuinfo")
CPUINFO_LIMIT = 4 << 20


@dataclass(frozen=True)
class Timed:
    """Times of one runner on one feed, in milliseconds: the median and the 90th
    percentile (nearest rank) of ``runs`` timed runs after ``warmup`` untimed ones."""

    median_ms: float
    p90_ms: float
    runs: int
    warmup: int

    @classmethod
    def of(cls, seconds: list[float], warmup: int) -> "Timed":
        if not seconds:
            raise ValueError("no timed run")
        ordered = sorted(value * 1000.0 for value in seconds)
        count = len(ordered)
        median = statistics.median(ordered)
        # Nearest rank: the smallest value at or above 90% of the runs.
        rank = max(1, -(-9 * count // 10))
        return cls(median, ordered[rank - 1], count, warmup)


def time_in_turn(runners: "list[Runner]", feed: "Feed", runs: int = 10, warmup: int = 1, budget_s: float = 5.0,
                 clock: Callable[[], float] = time.perf_counter) -> list[Timed]:
    """Each runner's times on ``feed``, run in turn (one run of each, then the next run of
    each; with several runners, each timed run after an untimed one of the same runner):
    ``warmup`` untimed rounds, then up to ``runs`` timed rounds, stopping once
    ``budget_s`` seconds (timed and untimed, all runners) are spent, after at least
    :data:`MIN_RUNS` timed rounds."""
    if not runners:
        return []
    runs = max(runs, MIN_RUNS)
    started = clock()
    for _ in range(max(warmup, 0)):
        for runner in runners:
            runner.run_one(feed)
    seconds: list[list[float]] = [[] for _ in runners]
    for done in range(runs):
        if done >= MIN_RUNS and clock() - started >= budget_s:
            break
        for index, runner in enumerate(runners):
            if len(runners) > 1:
                # One untimed run first: the runner that ran before leaves its thread pool
                # spinning for a while (onnxruntime's intra-op threads do by default), and a
                # timed run started in that window measures the contention, not the runner
                # (seen: transformers' forward at 150 ms right after a graph, 1.8 ms alone).
                runner.run_one(feed)
            before = clock()
            runner.run_one(feed)
            seconds[index].append(clock() - before)
    return [Timed.of(each, max(warmup, 0)) for each in seconds]


def time_runner(runner: "Runner", feed: "Feed", runs: int = 10, warmup: int = 1, budget_s: float = 5.0,
                clock: Callable[[], float] = time.perf_counter) -> Timed:
    """One runner's times on ``feed`` (:func:`time_in_turn` of it alone)."""
    return time_in_turn([runner], feed, runs, warmup, budget_s, clock)[0]


def machine(threads: int | None = None) -> dict[str, Any]:
    """What ran it: the CPU's model name (``/proc/cpuinfo`` where there is one, else
    ``platform.processor()``), its logical cores and, when the runner says, its threads."""
    described: dict[str, Any] = {"cpu": _cpu_model() or platform.processor() or platform.machine() or "unknown",
                                 "cores": os.cpu_count()}
    if threads is not None:
        described["threads"] = threads
    return described


def _cpu_model() -> str | None:
    try:
        # Bounded: a machine with hundreds of cores has a long cpuinfo, never megabytes.
        text = read_text(CPUINFO, CPUINFO_LIMIT)
    except (OSError, UnreadableFile):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            return " ".join(value.split())
    return None


def latency_record(timed: Timed, runner: "Runner", float_timed: Timed | None = None,
                   float_source: str | None = None) -> dict[str, Any]:
    """What ``report.json`` keeps under ``latency``."""
    record: dict[str, Any] = {
        "measured": True, "median_ms": timed.median_ms, "p90_ms": timed.p90_ms, "runs": timed.runs,
        "warmup": timed.warmup, "runtime": runner.description, "machine": machine(runner.threads),
        "simulated": bool(runner.simulated),
    }
    if float_timed is not None:
        record["float_source"] = {"artifact": float_source, "median_ms": float_timed.median_ms,
                                  "p90_ms": float_timed.p90_ms}
        record["ratio"] = timed.median_ms / float_timed.median_ms if float_timed.median_ms > 0 else None
    return record


def not_measured(reason: str) -> dict[str, Any]:
    """The ``latency`` of an artifact that does not run here, and why."""
    return {"measured": False, "reason": reason}


def latency_line(record: dict[str, Any]) -> str:
    """The line verification logs: ``latency: 3.1 ms median (p90 3.4), 1.8x its float source``."""
    if not record.get("measured"):
        return f"latency: not measured: {record.get('reason', '')}"
    line = f"latency: {_ms(record['median_ms'])} ms median (p90 {_ms(record['p90_ms'])})"
    if record.get("ratio") is not None:
        line += f", {record['ratio']:.2g}x its float source"
    if record.get("simulated"):
        line += " (simulated: says nothing of the device)"
    return line


def latency_checks(record: dict[str, Any], settings: "LatencySettings | None") -> list[Check]:
    """The opt-in gate: ``latency.ratio`` (the artifact's median over its float source's)
    at most ``max_ratio``. None without ``max_ratio``, nor for a simulator's time."""
    if settings is None or settings.max_ratio is None or record.get("simulated"):
        return []
    limit = settings.max_ratio
    if not record.get("measured"):
        return [Check(CHECK_NAME, "not measured", limit, "<=", False, f"not run here: {record.get('reason', '')}")]
    ratio = record.get("ratio")
    if ratio is None:
        return [Check(CHECK_NAME, "no float source", limit, "<=", False,
                      "the artifact's chain has no float source to time it against")]
    source = record["float_source"]
    return [Check.measure(CHECK_NAME, ratio, "<=", limit,
                          f"median {format_number(record['median_ms'])} ms vs {format_number(source['median_ms'])} ms "
                          f"of {source['artifact']} ({record['runs']} runs each, in turn; {record['runtime']})")]


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"
