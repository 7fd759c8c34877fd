"""Twelve tiny artifacts and one full-size tower, four ways: ``doit verify -n 1``, ``-n 2``,
two shards one after the other then the gather step, and a two-worker local Dask cluster.

    .venv/bin/python bench/scale_matrix.py [--no-full-size]

Ten tiny-fixture towers (64..192 px, float32 and float16), two A16W8 QDQ towers made
from two of them (two source chains) and a float32 tower at 224 from a synthetic
checkpoint with the real Qwen3.5 tower shape (461 M parameters; ``common.py``), built
and verified from nothing each time (no build/, no store, an empty remote cache; the
checkpoints themselves are made once, outside the timing). The process tree of each command is sampled every 0.2 s (psutil) for the
peak RSS of the doit process, of the largest edgebuild worker process (one build or
verification), of the largest other process (doit's -n workers, Dask's nannies and
workers), and of the whole tree at once.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

IMAGES = common.REPO / "data" / "calibration"
TINY_MANIFEST = f"""\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
  tower_{{image_size}}_{{dtype}}:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    matrix:
      image_size: [64, 96, 128, 160, 192]
      dtype: [fp32, fp16]
  qdq_64:
    kind: qwen3_5_tower_qdq
    source: tower_64_fp32
    calibration:
      images: [{IMAGES}/*.png]
  qdq_96:
    kind: qwen3_5_tower_qdq
    source: tower_96_fp32
    calibration:
      images: [{IMAGES}/*.png]
"""
FULL_SIZE_ENTRY = """\
  full:
    path: {checkpoint}
"""
FULL_SIZE_ARTIFACT = """\
  tower_full_224_fp32:
    kind: qwen3_5_vision_tower
    checkpoint: full
    image_size: 224
    dtype: fp32
"""
TINY_ARTIFACTS = 12
# A pull by the doit process itself ("  [name] pulled ..."), not one a cluster worker's
# relayed output reports ("  [name @ tcp://...] ...": a worker pulling a source).
DRIVER_PULL = re.compile(r"^  \[[^]@]+\] pulled from the remote cache", re.M)


def manifest(full_size: Path | None) -> str:
    if full_size is None:
        return TINY_MANIFEST
    text = TINY_MANIFEST.replace("artifacts:\n", FULL_SIZE_ENTRY.format(checkpoint=full_size) + "artifacts:\n", 1)
    return text + FULL_SIZE_ARTIFACT


class TreeSampler:
    """Peak RSS of a process and its descendants, by role."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.peaks = {"doit": 0, "edgebuild worker": 0, "other": 0, "tree": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for process in processes:
                try:
                    rss = process.memory_info().rss
                    command = " ".join(process.cmdline())
                except psutil.Error:
                    continue
                total += rss
                role = "doit" if process.pid == self.root.pid else (
                    "edgebuild worker" if "edgebuild.run.workers" in command else "other")
                self.peaks[role] = max(self.peaks[role], rss)
            self.peaks["tree"] = max(self.peaks["tree"], total)
            self._stop.wait(0.2)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def fresh(root: Path) -> Path:
    """A project directory with nothing built, stored or remembered (the fixture kept)."""
    for name in ("build", "artifacts.lock"):
        path = root / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for name in ("store", "doit.json", "statcache.sqlite", "statcache.sqlite-wal", "statcache.sqlite-shm", "mutex"):
        path = root / "cache" / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return root


def doit(root: Path, args: list[str], remote: Path | None) -> dict:
    environment = {"EDGEBUILD_REMOTE_CACHE": str(remote) if remote else "off"}
    started = time.perf_counter()
    process = subprocess.Popen([common.DOIT, *args], cwd=root, env={**os.environ, **environment},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(process.pid)
    stdout, stderr = process.communicate()
    peaks = sampler.stop()
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        raise RuntimeError(f"doit {' '.join(args)} failed ({process.returncode}):\n{stdout}\n{stderr}")
    return {"seconds": elapsed, "peaks": peaks, "stderr": stderr, "stdout": stdout}


def gib(value: int) -> str:
    return f"{value / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-full-size", action="store_true", help="the twelve tiny artifacts only")
    args = parser.parse_args()
    work = common.work_dir() / "scale_matrix"
    shutil.rmtree(work, ignore_errors=True)
    full_size = None
    if not args.no_full_size:
        # Kept between runs (idempotent): it is the slow part of setting up.
        full_size = common.write_qwen3_5_checkpoint(common.work_dir() / "qwen3_5_synthetic_scale", non_visual_gib=0.02)
    artifacts = TINY_ARTIFACTS + (0 if full_size is None else 1)
    roots = {name: common.project_dir(work / name, manifest(full_size)) for name in ("local", "shard1", "shard2", "gather", "dask")}
    for root in roots.values():
        common.run([common.DOIT, "list"], root)
        common.run([sys.executable, "-c", "from edgebuild.run.workspace import Workspace; from pathlib import Path; "
                    f"p = Workspace.open(Path({str(root)!r}) / 'artifacts.yaml', Path({str(root)!r})); p.checkpoint('qwen')"],
                   common.REPO)
    rows = []

    history = work / "n1.lock"
    for jobs in (1, 2):
        result = doit(fresh(roots["local"]), ["verify", "-n", str(jobs)], None)
        assert result["stderr"].count("] built in") == artifacts, result["stderr"]
        if jobs == 1:
            # What a committed lock file would hold after one full run: every artifact's cost.
            shutil.copyfile(roots["local"] / "artifacts.lock", history)
        rows.append([f"`doit verify -n {jobs}`", f"{result['seconds']:.0f}", gib(result["peaks"]["doit"]),
                     gib(result["peaks"]["edgebuild worker"]), gib(result["peaks"]["other"]), gib(result["peaks"]["tree"]),
                     f"{artifacts} built and verified"])

    shard_lines = {}
    for label, lock in (("no history", None), ("the `-n 1` run's lock file", history)):
        remote = work / f"remote-shards-{'history' if lock else 'none'}"
        remote.mkdir()
        shard_seconds = 0.0
        lines = []
        for index in (1, 2):
            root = fresh(roots[f"shard{index}"])
            if lock is not None:
                shutil.copyfile(lock, root / "artifacts.lock")
            result = doit(root, ["verify", "--shard", f"{index}/2"], remote)
            shard_seconds += result["seconds"]
            lines.append(next(line for line in result["stderr"].splitlines() if line.startswith(f"shard {index}/2:")))
            count = result["stderr"].count("] built in")
            rows.append([f"`doit verify --shard {index}/2`, {label}", f"{result['seconds']:.0f}", gib(result["peaks"]["doit"]),
                         gib(result["peaks"]["edgebuild worker"]), gib(result["peaks"]["other"]), gib(result["peaks"]["tree"]),
                         f"{count} built and verified"])
        shard_lines[label] = lines
        gather = doit(fresh(roots["gather"]), ["verify", "--pull-only"], remote)
        stderr = gather["stderr"]
        pulled = len(DRIVER_PULL.findall(stderr))
        kept = stderr.count("verified already")
        exported = stderr.count("] built in")
        judged = len(re.findall(r"^# \S+ \(\S+\): (PASSED|FAILED)", stderr, re.M))
        assert pulled == artifacts and exported == 0 and judged == 0, stderr
        rows.append(["gather: `doit verify --pull-only`", f"{gather['seconds']:.0f}", gib(gather["peaks"]["doit"]),
                     gib(gather["peaks"]["edgebuild worker"]), gib(gather["peaks"]["other"]), gib(gather["peaks"]["tree"]),
                     f"{pulled} pulled, {kept} reports kept, {exported} exported, {judged} judged"])
        rows.append([f"two shards + gather, one after the other ({label})", f"{shard_seconds + gather['seconds']:.0f}",
                     "", "", "", "", ""])

    dask_remote = work / "remote-dask"
    dask_remote.mkdir()
    result = doit(fresh(roots["dask"]), ["verify", "--dask", "local:2"], dask_remote)
    where: dict[str, int] = {}
    for worker in re.findall(r"  \[\S+ @ (tcp://\S+)\] started", result["stderr"]):
        where[worker] = where.get(worker, 0) + 1
    assert f"cluster: {artifacts} of {artifacts} built and verified" in result["stderr"], result["stderr"]
    rows.append(["`doit verify --dask local:2`", f"{result['seconds']:.0f}", gib(result["peaks"]["doit"]),
                 gib(result["peaks"]["edgebuild worker"]), gib(result["peaks"]["other"]), gib(result["peaks"]["tree"]),
                 "tasks per worker: " + ", ".join(str(count) for count in sorted(where.values(), reverse=True))
                 + f"; the driver pulled {len(DRIVER_PULL.findall(result['stderr']))}"])

    what = (f"{artifacts} artifacts" if full_size is None else "Twelve tiny artifacts and one full-size tower")
    full_line = ("" if full_size is None else
                 " and one float32 tower at 224 from a synthetic checkpoint with the real Qwen3.5 tower shape (461 M parameters)")
    markdown = f"""## {what}: -n 1, -n 2, two shards + gather, a two-worker Dask cluster (issue: scale past one machine)

`.venv/bin/python bench/scale_matrix.py` on {common.machine()}: **every configuration shares the
same two cores** (the two shards ran one after the other; both Dask workers run on this machine), so
this measures overhead and memory, not a speed-up from more machines. Single runs; times are
indicative. Ten tiny-fixture towers (64-192 px, float32 and float16), two A16W8 QDQ towers made from
two of them{full_line}, built and verified from nothing (no build/, no store, empty remote caches).
Peak RSS in GiB, sampled every 0.2 s over the command's process tree.

{common.table(["run", "wall (s)", "doit process", "largest edgebuild worker", "largest other process", "whole tree at once", "what it did"], rows)}

- Shards with no history: {"; ".join(shard_lines["no history"])}.
- Shards with the `-n 1` run's lock file (its `cost` entries): {"; ".join(shard_lines["the `-n 1` run's lock file"])}.
- The gather step re-did: fingerprints ({artifacts}), pulls with every file's digest checked ({pulled}), and
  keeping each pulled report that passed at the current verification fingerprint ({kept}); no export and
  no verification ran again.
- "largest other process": doit's `-n 2` workers (they only relay), Dask's nannies and workers (they only
  start worker processes and relay); the builds themselves are the edgebuild workers in every mode.
{"- No full-size tower in this run (`--no-full-size`)." if full_size is None else "- The full-size tower is what the largest edgebuild worker holds; the doit process and the Dask workers stay small."}
"""
    common.write_section("scale_matrix", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
