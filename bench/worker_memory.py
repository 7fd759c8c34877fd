"""What the doit process holds after a build and a verification: in its own process
(as before edgebuild/workers.py) vs in worker processes.

    .venv/bin/python bench/worker_memory.py [--full-size]

Each side is a fresh process that loads the project, builds one tower at 448 (float32)
and verifies it, sampling its own RSS: after loading the project, after the build,
after the verification, and its peak (VmHWM); with workers also the peak of its
worker processes (``RUSAGE_CHILDREN``: the largest child waited for). The tiny
fixture always; with ``--full-size`` also the synthetic full-size tower of
``tower_export.py`` (461 M parameters).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SIDE = textwrap.dedent('''
    import json, resource, sys
    from pathlib import Path

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024

    mode, manifest, root = sys.argv[1:4]
    from edgebuild.run.workspace import Workspace
    project = Workspace.open(manifest, Path(root))
    project.fingerprint(project.artifact("t"))
    out = {"loaded": rss(), "torch_imported": "torch" in sys.modules}
    if mode == "in_process":
        from edgebuild.run.builder import make_current, verify_artifact
        make_current(project, project.artifact("t"), log=lambda m: None)
        out["after_build"] = rss()
        out["peak_after_build"] = hwm()
        verify_artifact(project, project.artifact("t"), log=lambda m: None)
    else:
        from edgebuild.run.workers import run_worker
        run_worker("build", project, project.artifact("t"))
        out["after_build"] = rss()
        out["peak_after_build"] = hwm()
        out["build_worker_peak"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        run_worker("verify", project, project.artifact("t"))
        out["workers_peak"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    out["after_verify"] = rss()
    out["peak"] = hwm()
    print("RESULT " + json.dumps(out))
''')

NO_REMOTE = {**os.environ, "EDGEBUILD_REMOTE_CACHE": "off"}


def manifest(checkpoint: str) -> str:
    source = f"path: {checkpoint}" if checkpoint else "fixture: qwen3_5_vl_tiny"
    return f"""\
checkpoints:
  qwen:
    {source}
artifacts:
  t:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 448
    dtype: fp32
"""


def measure(label: str, checkpoint: str) -> dict:
    results = {}
    for mode in ("in_process", "workers"):
        root = common.work_dir() / f"worker_memory_{label}_{mode}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "artifacts.yaml").write_text(manifest(checkpoint))
        # The fixture (and the stat cache) beforehand, in another process: generating it
        # imports torch, which a project on a real checkpoint never does in the parent.
        subprocess.run([sys.executable, "-c", f"from edgebuild.run.workspace import Workspace; from pathlib import Path; "
                        f"p = Workspace.open({str(root / 'artifacts.yaml')!r}, Path({str(root)!r})); p.fingerprint(p.artifact('t')); p.save_caches()"],
                       check=True, env=NO_REMOTE)
        done = subprocess.run([sys.executable, "-c", SIDE, mode, str(root / "artifacts.yaml"), str(root)],
                              capture_output=True, text=True, check=False, env=NO_REMOTE)
        line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
        if done.returncode != 0 or line is None:
            raise SystemExit(f"{label}/{mode} failed:\n{done.stdout}\n{done.stderr}")
        results[mode] = json.loads(line[len("RESULT "):])
        shutil.rmtree(root, ignore_errors=True)
    return results


def gib(value: float | None) -> str:
    return "" if value is None else f"{value / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full-size", action="store_true")
    args = parser.parse_args()
    sets = {"tiny fixture": ""}
    if args.full_size:
        # The real tower shape; the non-visual filler is irrelevant here, so small.
        directory = common.work_dir() / "qwen3_5_synthetic_scale"
        sets["full size (461 M parameters)"] = str(common.write_qwen3_5_checkpoint(directory, non_visual_gib=0.02))
    rows = []
    for label, checkpoint in sets.items():
        measured = measure(label.split()[0], checkpoint)
        for mode, values in measured.items():
            rows.append([
                label, "in the doit process" if mode == "in_process" else "worker processes",
                gib(values["loaded"]), gib(values["after_build"]), gib(values["after_verify"]), gib(values["peak"]),
                gib(values.get("build_worker_peak")), gib(values.get("workers_peak")),
            ])
        print(json.dumps(measured, indent=2))
    markdown = f"""## Worker processes: what the doit process holds (issue: scale past one machine)

`.venv/bin/python bench/worker_memory.py{' --full-size' if args.full_size else ''}` on {common.machine()}.
One tower at 448 (float32) built then verified by one process that stands for doit's: RSS after loading
the project, after the build, after the verification, and its peak (VmHWM), in GiB; with workers also the
peak of the build worker and the largest worker (build or verify), from `RUSAGE_CHILDREN`.

{common.table(["checkpoint", "build and verify", "RSS loaded", "RSS after build", "RSS after verify", "peak", "build worker peak", "largest worker peak"], rows)}
- In its own process the doit process keeps what the build left (the allocator does not hand it back) and
  verifies on top of it: its peak is the build's leftovers plus the verification's. With worker processes it
  stays at what loading the project costs (no torch imported) whatever it builds; each worker's peak is its
  own step's, and the memory goes back when the worker exits.
- Full size: the synthetic checkpoint of `tower_export.py` with the real tower shape (the non-visual
  filler shrunk: it is not read). Single runs on a machine shared with other jobs; memory is not affected.
"""
    common.write_section("worker_memory", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
