"""How long an artifact takes to run here, and how that compares with its float source,
measured as benchmark tools measure it.

Verification (``chain.py``) times the artifact's runner on one evaluation feed, and the
float model of its chain in turn with it, run by run, so that whatever else the machine
does slows both alike. Both run on the same fixed number of threads (``threads``, 1 by
default: a loaded machine's cores are not the runtime's to take), where the runtime lets
it be fixed (``Runner.on_threads``); ``warmup`` untimed rounds first; then timed rounds
(``time.perf_counter``) until the median's 95% interval of every runner is within
:data:`TIGHT_WIDTH` of the median (after at least :data:`INTERVAL_RUNS`), or ``runs`` are
made, or ``budget_s`` seconds are spent (never before :data:`MIN_RUNS`).

Each time is a median with its 95% interval (order statistics, exact: no assumption on
the distribution of times), the p90 and ``n``. A time whose interval is wider than
:data:`NOISY_WIDTH` of its median is **noisy**: the machine's load decided it (the load
average is recorded beside it). The ratio of the two medians is stated only when both
are fixed to the same threads and neither is noisy (otherwise ``ratio`` is ``null`` and
``ratio_not_stated`` says why); the opt-in gate (``latency.ratio``) judges the ratio's
interval (the artifact's upper bound over the source's lower bound), never a point. A
simulator (the QNN HTP simulator) is not timed, its time saying nothing about the device
(``chain.py`` records ``simulated: true``), and no gate applies to it.

Pure timing: nothing here reads or writes a file but ``/proc/cpuinfo`` (bounded) for the
machine's description.
"""

from __future__ import annotations

import math
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
# Fewest timed runs before the timing may stop on a tight interval (6 make a 95% one).
INTERVAL_RUNS = 10
# The timing stops once every median's 95% interval is this narrow, relative to the median.
TIGHT_WIDTH = 0.05
# A median whose 95% interval is wider than this, relative to it, is noisy: not stated as a ratio.
NOISY_WIDTH = 0.25
CHECK_NAME = "latency.ratio"
CPUINFO = Path("/proc/cpuinfo")
CPUINFO_LIMIT = 4 << 20


@dataclass(frozen=True)
class Timed:
    """Times of one runner on one feed, in milliseconds: the median, its 95% interval
    (:func:`median_interval`; ``None`` bounds below 6 runs) and the 90th percentile
    (nearest rank) of ``runs`` timed runs after ``warmup`` untimed ones."""

    median_ms: float
    p90_ms: float
    runs: int
    warmup: int
    low_ms: float | None = None
    high_ms: float | None = None

    @classmethod
    def of(cls, seconds: list[float], warmup: int) -> "Timed":
        if not seconds:
            raise ValueError("no timed run")
        ordered = sorted(value * 1000.0 for value in seconds)
        count = len(ordered)
        median = statistics.median(ordered)
        # Nearest rank: the smallest value at or above 90% of the runs.
        rank = max(1, -(-9 * count // 10))
        bounds = median_interval(ordered)
        return cls(median, ordered[rank - 1], count, warmup, *(bounds or (None, None)))

    @property
    def width(self) -> float:
        """The interval's width relative to the median (infinite without an interval)."""
        if self.low_ms is None or self.high_ms is None or self.median_ms <= 0:
            return math.inf
        return (self.high_ms - self.low_ms) / self.median_ms

    @property
    def noisy(self) -> bool:
        return not self.width <= NOISY_WIDTH


def median_interval(ordered: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free ``confidence`` interval of the median of the sorted values
    ``ordered``: the order statistics ``(x_j, x_{n+1-j})`` with the largest ``j`` whose
    binomial coverage, ``1 - 2 P(Binomial(n, 1/2) < j)``, is at least ``confidence``.
    ``None`` when even the extremes do not cover it (fewer than 6 values for 95%)."""
    count = len(ordered)
    below = 0.0
    chosen = 0
    for j in range(1, count // 2 + 1):
        # P(B < j) = sum of P(B = i) for i < j.
        below += math.comb(count, j - 1) / 2.0 ** count
        if 1.0 - 2.0 * below < confidence:
            break
        chosen = j
    if chosen == 0:
        return None
    return ordered[chosen - 1], ordered[count - chosen]


def time_in_turn(runners: "list[Runner]", feed: "Feed", runs: int = 50, warmup: int = 1, budget_s: float = 5.0,
                 clock: Callable[[], float] = time.perf_counter) -> list[Timed]:
    """Each runner's times on ``feed``, run in turn (one run of each, then the next run of
    each; with several runners, each timed run after an untimed one of the same runner):
    ``warmup`` untimed rounds, then up to ``runs`` timed rounds, stopping once every
    median's interval is within :data:`TIGHT_WIDTH` (after :data:`INTERVAL_RUNS` rounds)
    or ``budget_s`` seconds (timed and untimed, all runners) are spent, after at least
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
        if done >= INTERVAL_RUNS and all(Timed.of(each, 0).width <= TIGHT_WIDTH for each in seconds):
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


def time_runner(runner: "Runner", feed: "Feed", runs: int = 50, warmup: int = 1, budget_s: float = 5.0,
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


def machine_load() -> float | None:
    """The one-minute load average (runnable processes), where the system says."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _time_json(timed: Timed) -> dict[str, Any]:
    return {"n": timed.runs, "median_ms": timed.median_ms,
            "median_ci95_ms": [timed.low_ms, timed.high_ms] if timed.low_ms is not None else None,
            "p90_ms": timed.p90_ms, "noisy": timed.noisy}


def latency_record(timed: Timed, runner: "Runner", float_timed: Timed | None = None,
                   float_source: str | None = None, float_threads: int | None = None,
                   load: tuple[float | None, float | None] = (None, None)) -> dict[str, Any]:
    """What ``report.json`` keeps under ``latency``: each side's ``n``, median, its 95%
    interval, p90 and whether it is noisy; the threads each ran on (``None``: the
    runtime's own choice); the machine and its load before and after; the ratio of the
    medians and its interval, where it may be stated."""
    record: dict[str, Any] = {
        "measured": True, **_time_json(timed), "runs": timed.runs, "warmup": timed.warmup,
        "runtime": runner.description, "threads": runner.threads, "machine": machine(runner.threads),
        "load": {"before": load[0], "after": load[1]}, "simulated": bool(runner.simulated),
    }
    if float_timed is not None:
        record["float_source"] = {"artifact": float_source, **_time_json(float_timed), "threads": float_threads}
        why = _unstated(timed, runner.threads, float_timed, float_threads)
        if why is None and float_timed.median_ms > 0 and float_timed.low_ms:
            record["ratio"] = timed.median_ms / float_timed.median_ms
            record["ratio_ci95"] = [timed.low_ms / float_timed.high_ms, timed.high_ms / float_timed.low_ms]
        else:
            record["ratio"] = None
            record["ratio_not_stated"] = why or "the float source's time is zero"
    return record


def _unstated(timed: Timed, threads: int | None, float_timed: Timed, float_threads: int | None) -> str | None:
    """Why the ratio of two times may not be stated; ``None`` when it may."""
    if threads is None or float_threads is None:
        return "noisy, not stated: the artifact's runtime chooses its own threads, so the two did not run alike"
    if threads != float_threads:
        return f"not stated: the artifact ran on {threads} threads and its float source on {float_threads}"
    noisy = [side for side, each in (("the artifact's", timed), ("its float source's", float_timed)) if each.noisy]
    if noisy:
        return (f"noisy, not stated: {' and '.join(noisy)} median is not known to within {NOISY_WIDTH:.0%} "
                "(the machine's load; see load)")
    return None


def not_measured(reason: str) -> dict[str, Any]:
    """The ``latency`` of an artifact that does not run here, and why."""
    return {"measured": False, "reason": reason}


def latency_line(record: dict[str, Any]) -> str:
    """The line verification logs: ``latency: 3.1 ms median [3.0, 3.2] (p90 3.4, n 20, 1
    thread), 1.8x its float source``, or why the ratio is not stated."""
    if not record.get("measured"):
        return f"latency: not measured: {record.get('reason', '')}"
    line = f"latency: {_ms(record['median_ms'])} ms median"
    interval = record.get("median_ci95_ms")
    if isinstance(interval, list) and len(interval) == 2:
        line += f" [{_ms(interval[0])}, {_ms(interval[1])}]"
    threads = record.get("threads")
    line += (f" (p90 {_ms(record['p90_ms'])}, n {record.get('n', record.get('runs'))}, "
             f"{threads if threads else 'runtime-chosen'} thread{'s' if threads != 1 else ''})")
    if record.get("noisy"):
        line += ", noisy"
    if record.get("ratio") is not None:
        line += f", {record['ratio']:.3g}x its float source"
    elif record.get("ratio_not_stated"):
        line += f"; ratio to its float source {record['ratio_not_stated']}"
    if record.get("simulated"):
        line += " (simulated: says nothing of the device)"
    return line


def latency_checks(record: dict[str, Any], settings: "LatencySettings | None") -> list[Check]:
    """The opt-in gate: ``latency.ratio``, the upper bound of the ratio's 95% interval (the
    artifact's upper bound over its float source's lower bound), at most ``max_ratio``.
    None without ``max_ratio``, nor for a simulator's time; failed where the ratio may not
    be stated (noisy, or run on other threads)."""
    if settings is None or settings.max_ratio is None or record.get("simulated"):
        return []
    limit = settings.max_ratio
    if not record.get("measured"):
        return [Check(CHECK_NAME, "not measured", limit, "<=", False, f"not run here: {record.get('reason', '')}")]
    source = record.get("float_source")
    if not isinstance(source, dict):
        return [Check(CHECK_NAME, "no float source", limit, "<=", False,
                      "the artifact's chain has no float source to time it against")]
    if record.get("ratio") is None:
        return [Check(CHECK_NAME, "not stated", limit, "<=", False,
                      f"the ratio is {record.get('ratio_not_stated', 'not stated')}; time it on a quieter machine, "
                      "or raise latency.budget_s")]
    return [Check.measure(CHECK_NAME, record["ratio_ci95"][1], "<=", limit,
                          f"upper bound of the ratio's 95% interval; median {format_number(record['median_ms'])} ms vs "
                          f"{format_number(source['median_ms'])} ms of {source['artifact']} ({record['n']} and "
                          f"{source['n']} runs, in turn, {record['threads']} thread(s) each; {record['runtime']})")]


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"
