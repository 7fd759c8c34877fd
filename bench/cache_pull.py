"""A pull from the remote cache: bytes written locally, and time, for a build the size
of the full-size tower.

    .venv/bin/python bench/cache_pull.py [--repeats 3] [--baseline REF]

The stored build has the files of the full-size Qwen3.5 tower exported at float32
(`tower_export.py`): a graph of 1 MiB and external weights of 1.72 GiB (random bytes
of that size: what a pull does depends on sizes, not on the weights' values), the
record and a report. It is pushed once to a remote cache in a local directory; then
each pull runs in a fresh process into an empty store and an empty `build/`, and
reports the bytes it caused to be written (`write_bytes` of `/proc/self/io`, counted
when pages are dirtied, whatever the writeback does later) and its wall time.
``--baseline REF`` runs the same pull with git REF's `edgebuild` package first on
`PYTHONPATH`, in the same rounds (the remote's layout is the same in both).

Goal (issue 22): a pull writes each byte once into the local store, then links or
copies it into `build/`: at most 2x the build's bytes on a filesystem without
reflinks (ext4 here), where the copy into `build/` is a second write.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from noop_fingerprint import baseline_package  # noqa: E402

WEIGHTS_BYTES = int(1.72 * 2**30)
GRAPH_BYTES = 1 << 20

PULL_SNIPPET = r"""
import json, sys, time
from pathlib import Path
from edgebuild.cache.remote import RemoteCache
from edgebuild.cache.store import Store

def written():
    with open("/proc/self/io") as handle:
        return int(next(line for line in handle if line.startswith("write_bytes")).split()[1])

remote, fingerprint, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
cache = RemoteCache.open(remote)
before, started = written(), time.perf_counter()
record = cache.pull("tower", fingerprint, Store(root / "cache" / "store"), root / "build" / "tower",
                    root / "build" / ".tmp", lambda message: None)
seconds, after = time.perf_counter() - started, written()
assert record is not None
print(json.dumps({"seconds": seconds, "written": after - before}))
"""


def stored_build(work: Path) -> tuple[str, int]:
    """Push a build with the full-size tower's file sizes; its fingerprint and bytes."""
    from edgebuild.cache.remote import RemoteCache
    from edgebuild.cache.store import Store
    from edgebuild.core.record import BuildRecord, output_manifest

    directory = work / "built"
    directory.mkdir()
    (directory / "model.onnx").write_bytes(os.urandom(GRAPH_BYTES))
    with open(directory / "model.onnx.data", "wb") as handle:
        remaining = WEIGHTS_BYTES
        while remaining:
            chunk = min(remaining, 64 << 20)
            handle.write(os.urandom(chunk))
            remaining -= chunk
    record = BuildRecord.create(kind="qwen3_5_vision_tower", params={"image_size": 448, "dtype": "fp32"},
                                inputs={}, code={}, versions={})
    record.completed("tower", {}, 0.0, output_manifest(directory)).write(directory)
    store = Store(work / "source-store")
    store.put(record.fingerprint, directory)
    (directory / "report.json").write_text(json.dumps({"format": 1, "passed": True}) + "\n")
    store.put_report(record.fingerprint, directory)
    (work / "remote").mkdir()
    assert RemoteCache.open(str(work / "remote")).push(record.fingerprint, store, lambda message: None)
    total = sum(path.stat().st_size for path in directory.iterdir() if path.name != "report.json")
    shutil.rmtree(directory)
    shutil.rmtree(work / "source-store")
    return record.fingerprint, total


def pull(work: Path, fingerprint: str, env: dict[str, str]) -> dict[str, float]:
    root = work / "pull"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    result = subprocess.run([sys.executable, "-c", PULL_SNIPPET, str(work / "remote"), fingerprint, str(root)],
                            cwd=root, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.splitlines()[-1])
    shutil.rmtree(root)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", metavar="REF", help="also pull with git REF's edgebuild, in the same rounds")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgebuild-cache-pull-", dir=common.work_dir()))
    ways = {"now": dict(os.environ, PYTHONPATH=str(common.REPO))}
    try:
        if args.baseline:
            ways["before"] = dict(os.environ, PYTHONPATH=str(baseline_package(args.baseline, work)))
        fingerprint, build_bytes = stored_build(work)
        measured: dict[str, list[dict[str, float]]] = {way: [] for way in ways}
        for round_ in range(args.repeats):
            for way, env in ways.items():
                measured[way].append(pull(work, fingerprint, env))
            print(f"round {round_ + 1}: " + ", ".join(
                f"{way} {values[-1]['written'] / build_bytes:.2f}x in {values[-1]['seconds']:.2f} s"
                for way, values in measured.items()), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    ratio = {}
    for way in ways:
        written = statistics.median(value["written"] for value in measured[way])
        seconds = statistics.median(value["seconds"] for value in measured[way])
        ratio[way] = written / build_bytes
        label = "pull" + (f" at `{args.baseline}` (before)" if way == "before" else "")
        rows.append([label, f"{written / 2**30:.2f}", f"{ratio[way]:.2f}x", f"{seconds:.2f}"])
    command_line = f"`.venv/bin/python bench/cache_pull.py --repeats {args.repeats}" + (
        f" --baseline {args.baseline}`" if args.baseline else "`")
    markdown = (
        "## A pull from the remote cache: bytes written locally (issue: a cache you can trust)\n\n"
        f"{command_line} on {common.machine()}, ext4 (no reflinks). A build with the full-size tower's files "
        f"(float32: {build_bytes / 2**30:.2f} GiB, graph, weights and record) pulled from a directory remote into an "
        "empty store and `build/`, a fresh process per pull; bytes written are the process's `write_bytes`, "
        f"median of {args.repeats}.\n\n"
        + common.table(["way", "written (GiB)", "x the build's bytes", "seconds"], rows)
        + "\n\nGoal: each byte written once into the store, then copied into `build/` (2x on a filesystem "
        f"without reflinks): {'met' if ratio['now'] <= 2.05 else 'not met'} ({ratio['now']:.2f}x"
        + (f"; {ratio['before']:.2f}x before" if "before" in ratio else "") + ").\n"
    )
    print(markdown)
    common.write_section("cache_pull", markdown)


if __name__ == "__main__":
    main()
