"""Export of the full-size Qwen3.5 vision tower at 448: time and peak memory per phase.

    .venv/bin/python bench/tower_export.py [--dtypes float32 float16]

Uses the synthetic checkpoint of ``noop_fingerprint.py`` (the real tower shape,
461 M parameters, in a shard shared with multi-GB non-visual tensors). The build
and the verification each run in a process of their own, as doit's workers run
them; a sampler thread reads the process's resident set every 20 ms and
attributes it to the phase being run (load, wrapper check, export, sanitize,
verify). The target: peak RSS never above the tower's float32
size plus the exporter's own working set; loading must not touch non-visual
tensors (the bytes it reads are checked against the tower's size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PHASES = ("load", "wrapper check", "export", "sanitize", "verify")


def run_side(root: Path, name: str, step: str) -> dict:
    """One step of the artifact in this process, as a doit worker runs it: ``build``
    (make it current) or ``verify`` (judge it); RSS sampled per phase."""
    sys.path.insert(0, str(common.REPO))
    from edgebuild.run.builder import make_current, verify_artifact
    from edgebuild.run.workspace import Workspace

    sampler = common.RssSampler()
    sampler.start()

    def log(message: str) -> None:
        # The kind's progress lines mark the end of each phase.
        if message.startswith("loaded"):
            sampler.phase = "wrapper check"
        elif message.startswith("fixed-shape wrapper"):
            sampler.phase = "export"
        elif message.startswith("exported"):
            sampler.phase = "done"

    project = Workspace.open(root / "artifacts.yaml", root)
    if step == "verify":
        # What a verify worker has imported before it judges anything.
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    baseline = common.rss()
    read_before = _read_bytes()
    started = time.perf_counter()
    if step == "build":
        sampler.phase = "load"
        record = make_current(project, project.artifact(name), log=log)
        result = {"timings": {key: record.build_info["timings"][f"{key.replace(' ', '_')}_s"]
                              for key in PHASES if key != "verify"}}
    else:
        sampler.phase = "verify"
        report = verify_artifact(project, project.artifact(name), log=lambda message: None)
        result = {"timings": {"verify": time.perf_counter() - started}, "passed": report.passed,
                  "max_abs": next(check.value for check in report.checks if check.name == "max_abs"),
                  "cosine": next(check.value for check in report.checks if check.name == "cosine")}
    read_bytes = _read_bytes() - read_before
    sampler.running = False
    sampler.join()
    return result | {"seconds": time.perf_counter() - started, "peaks": sampler.peaks, "baseline_rss": baseline,
                     "read_bytes": read_bytes}


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def plot(results: dict, parameters: int) -> None:
    """Time and peak RSS per phase, one bar group per dtype: bench/results/tower_export.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / max(len(results), 1)
    for index, (dtype, result) in enumerate(results.items()):
        positions = [phase_index + index * width for phase_index in range(len(PHASES))]
        time_axis.bar(positions, [result["timings"][phase] for phase in PHASES], width, label=dtype)
        peaks = [result["peaks"].get("export" if phase == "sanitize" else phase, 0) / 2**30 for phase in PHASES]
        memory_axis.bar(positions, peaks, width, label=dtype)
    for axis, label in ((time_axis, "seconds"), (memory_axis, "peak RSS (GiB)")):
        axis.set_xticks([phase_index + width * (len(results) - 1) / 2 for phase_index in range(len(PHASES))], PHASES, rotation=20)
        axis.set_ylabel(label)
        axis.legend()
    memory_axis.axhline(parameters * 4 / 2**30, color="gray", linestyle="--", linewidth=1)
    memory_axis.text(0, parameters * 4 / 2**30, " float32 weights", va="bottom", color="gray", fontsize=8)
    figure.suptitle("Qwen3.5 vision tower (461 M parameters) at 448: export phases")
    figure.tight_layout()
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    figure.savefig(common.RESULTS / "tower_export.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--step", choices=["build", "verify"], help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(args.root, args.side, args.step)))
        return

    work = common.work_dir()
    checkpoint = common.write_qwen3_5_checkpoint(work / "qwen3_5_synthetic")
    sys.path.insert(0, str(common.REPO))
    from edgebuild.core.checkpoint import Checkpoint

    visual_bytes = sum(entry.nbytes for entry in Checkpoint(checkpoint).select(("model.visual.",)).values())
    parameters = visual_bytes // 2
    rows = []
    results = {}
    for dtype in args.dtypes:
        root = work / f"project_export_{dtype}"
        manifest = (
            f"checkpoints:\n  qwen:\n    path: {checkpoint}\n"
            f"artifacts:\n  tower:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 448\n    dtype: {dtype}\n"
        )
        common.project_dir(root, manifest)
        common.run(["rm", "-rf", str(root / "build"), str(root / "cache")], common.REPO)
        common.drop_page_cache()
        steps = {}
        for step in ("build", "verify"):
            output = common.run([sys.executable, __file__, "--side", "tower", "--step", step, "--root", str(root)],
                                common.REPO)
            steps[step] = json.loads(output.stdout.strip().splitlines()[-1])
        build, verify = steps["build"], steps["verify"]
        assert verify["passed"], verify
        result = {"timings": build["timings"] | verify["timings"], "read_bytes": build["read_bytes"],
                  "max_abs": verify["max_abs"], "cosine": verify["cosine"], "steps": steps,
                  # One figure per phase: each step's own samples.
                  "peaks": build["peaks"] | verify["peaks"]}
        results[dtype] = result
        weight_bytes = parameters * (4 if dtype == "float32" else 2)
        for phase in PHASES:
            # The sampler cannot tell export from sanitize (one progress line ends both).
            sampled = "export" if phase == "sanitize" else phase
            step = verify if phase == "verify" else build
            peak_of_phase = step["peaks"].get(sampled, 0)
            rows.append([
                dtype, phase, f"{result['timings'][phase]:.1f}",
                f"{peak_of_phase / 2**30:.2f}" + (" (with export)" if phase == "sanitize" else ""),
                f"{(peak_of_phase - step['baseline_rss']) / weight_bytes:.2f}x",
            ])
        for step_name, step in steps.items():
            peak = max(step["peaks"].values())
            rows.append([dtype, f"**{step_name} worker peak**", f"{step['seconds']:.1f}", f"{peak / 2**30:.2f}",
                         f"{(peak - step['baseline_rss']) / weight_bytes:.2f}x"])
        print(dtype, json.dumps(result), flush=True)

    float32_bytes = parameters * 4
    lines = []
    for dtype, result in results.items():
        lines.append(
            f"- {dtype}: the build read {result['read_bytes'] / 2**30:.2f} GiB from disk (page cache dropped first) for a "
            f"{visual_bytes / 2**30:.2f} GiB tower in a {sum(p.stat().st_size for p in checkpoint.glob('*.safetensors')) / 2**30:.1f} GiB "
            f"checkpoint; verification max abs {result['max_abs']:.2e}, cosine {result['cosine']:.8f}."
        )
    plot(results, parameters)
    markdown = f"""## Tower export at 448, full size (issue: benchmarks)

`.venv/bin/python bench/tower_export.py --dtypes {' '.join(args.dtypes)}` on {common.machine()}.
The synthetic Qwen3.5 checkpoint of the no-op benchmark: the real tower shape ({parameters / 1e6:.0f} M parameters,
float32 size {float32_bytes / 2**30:.2f} GiB). The build and the verification each run in a process of their own, as
`doit`'s workers run them; peak RSS per phase is sampled every 20 ms in that process, and "x weights" is (peak - the
process's RSS before the step, with torch and onnxruntime imported) / the tower's weight size in the export dtype.
The reference of every verification is the float32 model (what a user deploys is compared with the model they
trained), so a float16 verification holds float32 weights: at least 2x the float16 ones.

{common.table(["dtype", "phase", "time (s)", "peak RSS (GiB)", "x weights"], rows)}

{chr(10).join(lines)}

![time and peak RSS per phase](bench/results/tower_export.png)
"""
    common.write_section("tower_export", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
