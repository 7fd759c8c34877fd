"""Latency, measured where it can be (issue 38): the median and p90 of timed runs after
warm-up, the artifact and its float source timed in turn, the machine described, and
an opt-in gate on their ratio, never on an absolute time; a simulator's time recorded
and never gated."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy
import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.core.runner import Runner, TensorSpec
from edgebuild.core.thresholds import LatencySettings, latency_settings
from edgebuild.errors import ManifestError
from edgebuild.run.latency import (INTERVAL_RUNS, MIN_RUNS, Timed, median_interval, latency_checks, latency_line, latency_record, machine,
                                   not_measured, time_in_turn, time_runner)

from helpers import CLIP_TO_QDQ, lay_out_project


def _tiny_graph(path: Path, width: int = 64) -> Path:
    """y = relu(x @ W + b), x [1, 64], y [1, width]: a graph onnxruntime runs in microseconds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    generator = numpy.random.default_rng(0)
    weight = numpy_helper.from_array(generator.standard_normal((64, width)).astype("float32"), "W")
    bias = numpy_helper.from_array(generator.standard_normal(width).astype("float32"), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], initializer=[weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


class _Clock:
    """A clock that each run of a fake runner moves by the runner's own step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _fake(name: str, clock: _Clock, step: float, calls: list[str]) -> Runner:
    def run_one(feed):
        calls.append(name)
        clock.now += step
        return {"y": feed["x"]}

    return Runner(name, [TensorSpec("x", (1,), "float32")], ["y"], run_one)


# --- the numbers ------------------------------------------------------------------------


def test_median_and_p90_by_nearest_rank() -> None:
    timed = Timed.of([0.001 * value for value in (5, 1, 4, 2, 3, 10, 6, 7, 9, 8)], warmup=2)
    assert (timed.median_ms, timed.runs, timed.warmup) == (pytest.approx(5.5), 10, 2)
    # Nearest rank: the 9th of 10 ordered values.
    assert timed.p90_ms == pytest.approx(9.0)
    three = Timed.of([0.003, 0.001, 0.002], warmup=0)
    assert (three.median_ms, three.p90_ms) == (pytest.approx(2.0), pytest.approx(3.0))
    with pytest.raises(ValueError):
        Timed.of([], warmup=1)


def test_runners_are_timed_in_turn_after_warmup_within_the_budget() -> None:
    clock, calls = _Clock(), []
    artifact, source = _fake("artifact", clock, 0.002, calls), _fake("source", clock, 0.001, calls)
    feed = {"x": numpy.zeros(1, "float32")}
    timed_artifact, timed_source = time_in_turn([artifact, source], feed, runs=5, warmup=2, budget_s=100.0, clock=clock)
    # Run by run, warm-up first (untimed); each timed run after an untimed one of its own.
    assert calls == ["artifact", "source"] * 2 + ["artifact", "artifact", "source", "source"] * 5
    assert (timed_artifact.runs, timed_artifact.warmup, timed_source.runs) == (5, 2, 5)
    assert timed_artifact.median_ms == pytest.approx(2.0) and timed_source.median_ms == pytest.approx(1.0)

    # A budget spent stops the timing, but never before MIN_RUNS timed runs.
    clock, calls = _Clock(), []
    (slow,) = time_in_turn([_fake("slow", clock, 10.0, calls)], feed, runs=100, warmup=1, budget_s=1.0, clock=clock)
    assert slow.runs == MIN_RUNS and len(calls) == 1 + MIN_RUNS
    clock, calls = _Clock(), []
    quick = time_runner(_fake("quick", clock, 0.125, calls), feed, runs=100, warmup=0, budget_s=1.0, clock=clock)
    assert quick.runs == 8


def test_an_onnxruntime_session_timed_with_its_float_source(tmp_path: Path) -> None:
    from edgebuild.targets.runners import onnx_runner

    artifact = onnx_runner(_tiny_graph(tmp_path / "a.onnx"), threads=1)
    source = onnx_runner(_tiny_graph(tmp_path / "b.onnx", width=4096), threads=1)
    assert (artifact.threads, source.threads) == (1, 1)
    feed = {"x": numpy.ones((1, 64), "float32")}
    timed = time_runner(artifact, feed, runs=20, warmup=2, budget_s=5.0)
    assert INTERVAL_RUNS <= timed.runs <= 20 and 0 < timed.median_ms <= timed.p90_ms
    assert timed.low_ms <= timed.median_ms <= timed.high_ms
    first, second = time_in_turn([artifact, source], feed, runs=10)
    record = latency_record(first, artifact, second, "b", source.threads, (0.5, 0.7))
    assert record["median_ms"] > 0 and record["p90_ms"] >= record["median_ms"] and record["n"] == record["runs"] == 10
    assert record["median_ci95_ms"] == [first.low_ms, first.high_ms] and record["noisy"] is first.noisy
    assert record["warmup"] == 1 and record["simulated"] is False and record["threads"] == 1
    assert record["load"] == {"before": 0.5, "after": 0.7}
    assert record["runtime"].startswith("onnxruntime ") and "CPUExecutionProvider" in record["runtime"]
    assert record["float_source"]["artifact"] == "b" and record["float_source"]["median_ms"] > 0
    assert record["float_source"]["threads"] == 1 and record["float_source"]["n"] == 10
    if not (first.noisy or second.noisy):
        assert record["ratio"] == pytest.approx(first.median_ms / second.median_ms)
        low, high = record["ratio_ci95"]
        assert low <= record["ratio"] <= high
    else:
        assert record["ratio"] is None and record["ratio_not_stated"].startswith("noisy, not stated")
    assert record["machine"]["cores"] == os.cpu_count() and record["machine"]["cpu"]
    json.dumps(record)
    line = latency_line(record)
    assert line.startswith("latency: ") and " ms median [" in line and "n 10, 1 thread)" in line
    assert "its float source" in line
    # Alone: no float source, no ratio.
    alone = latency_record(timed, artifact)
    assert "float_source" not in alone and "ratio" not in alone
    assert latency_line(alone) == f"latency: {latency_line(alone).split(': ', 1)[1]}" and "float" not in latency_line(alone)


def test_the_median_interval_is_the_order_statistics_of_the_binomial() -> None:
    # The textbook ranks of a 95% interval of the median (e.g. Conover, table A3).
    for count, (low, high) in {6: (1, 6), 10: (2, 9), 20: (6, 15), 50: (18, 33)}.items():
        assert median_interval([float(rank) for rank in range(1, count + 1)]) == (low, high)
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None


def test_a_ratio_is_stated_only_for_tight_times_on_the_same_threads() -> None:
    steady = Timed.of([0.010 + 0.0001 * (index % 3) for index in range(20)], warmup=1)
    loaded = Timed.of([0.010 * (1 + index % 5) for index in range(20)], warmup=1)
    assert not steady.noisy and loaded.noisy
    artifact = _fake("artifact", _Clock(), 0.0, [])
    on_one = replace(artifact, threads=1)
    stated = latency_record(steady, on_one, steady, "f", 1)
    assert stated["ratio"] == pytest.approx(1.0) and "ratio_not_stated" not in stated
    noisy = latency_record(loaded, on_one, steady, "f", 1)
    assert noisy["ratio"] is None and noisy["ratio_not_stated"].startswith("noisy, not stated: the artifact's median")
    assert "noisy, not stated" in latency_line(noisy) and "x its float source" not in latency_line(noisy)
    apart = latency_record(steady, on_one, steady, "f", 2)
    assert apart["ratio"] is None and "1 threads and its float source on 2" in apart["ratio_not_stated"]
    unpinned = latency_record(steady, replace(artifact, threads=None), steady, "f", 1)
    assert unpinned["ratio"] is None and "chooses its own threads" in unpinned["ratio_not_stated"]
    # The gate judges the ratio's interval, and a ratio not stated fails it, saying why.
    (gate,) = latency_checks(stated, LatencySettings(max_ratio=1.0))
    assert gate.value == stated["ratio_ci95"][1] > 1.0 and not gate.passed and "upper bound" in gate.detail
    (refused,) = latency_checks(noisy, LatencySettings(max_ratio=100.0))
    assert not refused.passed and refused.value == "not stated" and "noisy" in refused.detail


def test_a_pinned_torch_runner_holds_its_threads_and_gives_them_back() -> None:
    import torch

    from edgebuild.targets.runners import torch_runner

    before = torch.get_num_threads()
    runner = torch_runner(lambda x: x * 2, [TensorSpec("x", (1,), "float32")], ["y"], "double")
    pinned = runner.on_threads(1)
    try:
        assert pinned.threads == 1 and torch.get_num_threads() == 1
        assert pinned.run_one({"x": numpy.ones(1, "float32")})["y"].tolist() == [2.0]
    finally:
        pinned.close()
    assert torch.get_num_threads() == before


def test_the_machine_is_described() -> None:
    described = machine(threads=3)
    assert described["cores"] == os.cpu_count() and described["threads"] == 3 and described["cpu"]
    if Path("/proc/cpuinfo").is_file() and "model name" in Path("/proc/cpuinfo").read_text():
        (line,) = {line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")}
        assert described["cpu"] == " ".join(line.split(":", 1)[1].split())
    assert "threads" not in machine()


def test_the_ratio_gate_is_opt_in_and_never_judges_a_simulator() -> None:
    base = {"measured": True, "n": 10, "median_ms": 3.0, "median_ci95_ms": [2.9, 3.1], "p90_ms": 3.5, "runs": 10,
            "warmup": 1, "runtime": "r", "threads": 1, "machine": machine(), "simulated": False,
            "float_source": {"artifact": "f", "n": 10, "median_ms": 2.0, "median_ci95_ms": [1.95, 2.05], "p90_ms": 2.1,
                             "threads": 1},
            "ratio": 1.5, "ratio_ci95": [2.9 / 2.05, 3.1 / 1.95]}
    assert latency_checks(base, LatencySettings()) == []
    assert latency_checks(base, None) == []
    (passed,) = latency_checks(base, LatencySettings(max_ratio=2.0))
    assert (passed.name, passed.value, passed.limit, passed.comparison, passed.passed) == \
        ("latency.ratio", pytest.approx(3.1 / 1.95), 2.0, "<=", True)
    (failed,) = latency_checks(base, LatencySettings(max_ratio=1e-6))
    assert failed.name == "latency.ratio" and not failed.passed and "of f" in failed.detail
    # A simulator's time says nothing of the device: recorded, never gated.
    assert latency_checks(base | {"simulated": True}, LatencySettings(max_ratio=1e-6)) == []
    # A gate that cannot be judged fails, and says why.
    alone = {key: value for key, value in base.items() if key not in ("float_source", "ratio")}
    (unjudged,) = latency_checks(alone, LatencySettings(max_ratio=2.0))
    assert not unjudged.passed and "no float source" in unjudged.detail
    (not_run,) = latency_checks(not_measured("no runtime here"), LatencySettings(max_ratio=2.0))
    assert not not_run.passed and "no runtime here" in not_run.detail


# --- the manifest -----------------------------------------------------------------------

MANIFEST = CLIP_TO_QDQ


def _with_latency(latency: str) -> str:
    return MANIFEST.replace("      images: [held_out/*.png]\n",
                            f"      images: [held_out/*.png]\n    verify: {{latency: {latency}}}\n")


def test_latency_settings_are_read_from_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(_with_latency("{runs: 20, warmup: 0, budget_s: 2, max_ratio: 1.2}"))
    manifest = load_manifest(tmp_path / "artifacts.yaml")
    assert latency_settings(manifest.artifacts["qdq"]) == LatencySettings(runs=20, warmup=0, budget_s=2.0, max_ratio=1.2)
    assert latency_settings(manifest.artifacts["clip"]) == LatencySettings()
    assert LatencySettings().max_ratio is None


@pytest.mark.parametrize("latency, message", [
    ("{max_ratio: 0}", "verify -> latency -> max_ratio: "),
    ("{runs: 2}", "verify -> latency -> runs: "),
    ("{budget_s: fast}", "verify -> latency -> budget_s: "),
    ("{max_ms: 3}", "verify -> latency -> max_ms: "),
])
def test_bad_latency_settings_are_one_line_naming_the_key(tmp_path: Path, latency: str, message: str) -> None:
    (tmp_path / "artifacts.yaml").write_text(_with_latency(latency))
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    text = str(caught.value)
    assert "\n" not in text and message in text, text
    assert text.startswith(f"{tmp_path / 'artifacts.yaml'}:")


# --- in verification --------------------------------------------------------------------



@pytest.mark.slow
def test_verification_records_latency_against_the_float_source_and_gates_it_on_request(tmp_path: Path) -> None:
    project = lay_out_project(tmp_path, MANIFEST)
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    for name, source in (("qdq", "clip"), ("clip", "clip (its float model)")):
        report = json.loads((tmp_path / "build" / name / "report.json").read_text())
        latency = report["latency"]
        assert latency["measured"] and latency["median_ms"] > 0 and latency["p90_ms"] >= latency["median_ms"]
        # Up to the 50 runs of the default: a tight interval stops it from 10 on, the 5 s budget
        # stops a loaded machine's timing earlier, never before MIN_RUNS (the budget's own test,
        # with a clock of its own, is above).
        assert MIN_RUNS <= latency["runs"] <= 50 and latency["warmup"] == 1 and latency["simulated"] is False
        assert latency["machine"]["cores"] == os.cpu_count() and latency["load"]["before"] is not None
        # Both sides on the one thread of the default.
        assert latency["threads"] == 1 and latency["float_source"]["threads"] == 1
        assert latency["float_source"]["artifact"] == source and latency["float_source"]["median_ms"] > 0
        if latency["noisy"] or latency["float_source"]["noisy"]:
            assert latency["ratio"] is None and latency["ratio_not_stated"].startswith("noisy, not stated")
        else:
            assert latency["ratio"] == pytest.approx(latency["median_ms"] / latency["float_source"]["median_ms"])
        # No max_ratio: measured, never a check.
        assert not [check for check in report["checks"] if check["name"].startswith("latency.")]
        assert report["passed"]
        logged = [line for line in verified.stderr.splitlines() if line.startswith(f"  [{name}] latency: ")]
        assert len(logged) == 1 and "ms median [" in logged[0] and "its float source" in logged[0], logged
    qdq = json.loads((tmp_path / "build" / "qdq" / "report.json").read_text())
    assert qdq["latency"]["runtime"] == qdq["metrics"]["vs_float"]["runner"]

    # A gate no graph can meet: the verification fails on latency.ratio alone.
    project.manifest(_with_latency("{max_ratio: 1.0e-6, runs: 3}"))
    failed = project.doit("verify", "qdq")
    assert failed.returncode != 0
    report = json.loads((tmp_path / "build" / "qdq" / "report.json").read_text())
    assert not report["passed"] and report["latency"]["runs"] == 3
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["latency.ratio"]
    assert "latency.ratio = " in failed.stdout + failed.stderr


# --- doit diff and the report page ------------------------------------------------------


def _report(median: float | None, ratio: float | None = None, **more) -> dict:
    if median is None:
        return {"latency": not_measured("no runtime here")}
    latency = {"measured": True, "median_ms": median, "p90_ms": median * 1.1, "runs": 10, "warmup": 1,
               "runtime": "onnxruntime 1.0 CPUExecutionProvider (model.onnx)",
               "machine": {"cpu": "Some CPU <x>", "cores": 2}, "simulated": False} | more
    if ratio is not None:
        latency |= {"float_source": {"artifact": "clip", "median_ms": median / ratio, "p90_ms": median / ratio},
                    "ratio": ratio}
    return {"latency": latency}


def test_diff_shows_latency_old_and_new() -> None:
    from edgebuild.run.diff import ArtifactDiff, Diff, _latency, render

    change = _latency(_report(3.1, 1.8), _report(3.4, 1.9))
    assert change is not None and change.to_json() == {"median_ms_before": 3.1, "median_ms_after": 3.4,
                                                       "ratio_before": 1.8, "ratio_after": 1.9}
    assert change.describe() == "latency: 3.1 → 3.4 ms median, 1.8x → 1.9x its float source"
    assert _latency(None, _report(3.4)).describe() == "latency: – → 3.4 ms median"
    assert _latency(_report(None), _report(None)) is None and _latency({}, {"latency": "odd"}) is None
    diff = Diff("HEAD", None, (ArtifactDiff("qdq", "onnx_qdq", "changed", "a" * 64, "b" * 64, ("bits 8 → 16",),
                                            latency=change),))
    assert "    latency: 3.1 → 3.4 ms median, 1.8x → 1.9x its float source" in render(diff)
    assert diff.to_json()["artifacts"][0]["latency"]["ratio_after"] == 1.9


def test_the_report_page_shows_latency_escaped() -> None:
    from edgebuild.cli.report_page.page import _latency

    shown = _latency(_report(3.1, 1.8)["latency"])
    assert shown.startswith('<p class="latency">latency: 3.1 ms median, p90 3.41, over 10 runs, 1.8x its float source '
                            "clip (1.72222 ms); onnxruntime")
    interval = _latency(_report(3.1, median_ci95_ms=[3.0, 3.2], noisy=True, load={"before": 1.5})["latency"])
    assert "3.1 ms median (95% CI 3–3.2), p90 3.41, over 10 runs, noisy" in interval and "load 1.5)" in interval
    unstated = _report(3.1, 1.8)["latency"] | {"ratio": None, "ratio_not_stated": "noisy, not stated: x"}
    assert "its ratio to clip is noisy, not stated: x" in _latency(unstated) and "1.8x" not in _latency(unstated)
    assert "Some CPU &lt;x&gt; (2 cores)" in shown and "<x>" not in shown
    assert "simulated" in _latency(_report(3.1, simulated=True)["latency"])
    assert "not measured here: no runtime here" in _latency(not_measured("no runtime here"))
    assert _latency(None) == "" and "could not be read" in _latency({"measured": True})
