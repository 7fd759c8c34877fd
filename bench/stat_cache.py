"""Saving one task's stat cache entries, and checking them, at 100 and 10,000 cached files.

    .venv/bin/python bench/stat_cache.py [--repeats 15] [--baseline REF]

What each task of a build costs in stat cache upkeep, outside any hashing: a worker's
save of the entries it made (a build's three outputs, rewritten and remembered), then
the check of those outputs by the process that started the worker, which must take
the worker's digests rather than read the files. Both with a cache that already holds
100, then 10,000 other files. ``--baseline REF`` measures git REF's ``edgebuild`` too
(the JSON file, read, merged and rewritten whole at each save, and read whole again by
the parent after each worker), in the same run. A fresh process per size and way;
medians of the repeats.

Goal (issue 40): the cost of saving a task is independent of the number of artifacts:
at 10,000 cached files at most 1.5x what it is at 100.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from noop_fingerprint import baseline_package  # noqa: E402

SIZES = (100, 10_000)
TASK_OUTPUTS = 3
GOAL = 1.5

# Run with the package under test first on sys.path (``python -c`` in its directory).
# Works with the JSON stat cache of before issue 40 and the SQLite one after it.
SNIPPET = """
import json, statistics, sys, time
from pathlib import Path
try:
    from edgebuild.core.statcache import StatCache
    name = "statcache.sqlite"
except ImportError:
    from edgebuild.core.fingerprint import StatCache
    name = "statcache.json"
import edgebuild
work, cache_dir, count, repeats = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
cache_path = cache_dir / name
others = sorted((work / "files").iterdir())[:count]
outputs = sorted((work / "build" / "t").iterdir())
filling = StatCache(cache_path)
for path in others:
    filling.remember(path, "0" * 64)
filling.save()
del filling

# The process that starts the workers: it checked the outputs of an earlier build.
parent = StatCache(cache_path)
for path in outputs:
    parent.file_digest(path)
parent.save()
hashed = parent.bytes_hashed
saves, checks = [], []
for round_ in range(repeats):
    # A worker: it writes the outputs, remembers their digests and saves (the task's save).
    worker = StatCache(cache_path)
    for path in outputs:
        path.write_bytes(round_.to_bytes(4, "little") * 256)
        worker.remember(path, "0" * 64)
    started = time.perf_counter()
    worker.save()
    saves.append(time.perf_counter() - started)
    del worker
    # The parent checks the new outputs, reading none of their bytes.
    started = time.perf_counter()
    if name == "statcache.json":
        # What scheduler.adopt_output_digests did before: the whole file read again.
        prefix = str((work / "build" / "t").resolve()) + "/"
        for key, entry in StatCache(cache_path).entries.items():
            if key.startswith(prefix) and key not in parent.dirty:
                parent.entries[key] = entry
    for path in outputs:
        parent.file_digest(path)
    checks.append(time.perf_counter() - started)
    assert parent.bytes_hashed == hashed, "the parent hashed an output the worker had saved"
print(json.dumps({"package": edgebuild.__file__, "save": statistics.median(saves),
                  "check": statistics.median(checks)}))
"""


def measure(package_root: Path, work: Path, way: str, count: int, repeats: int) -> dict[str, float]:
    cache_dir = work / f"cache-{way}-{count}"
    result = common.run([sys.executable, "-c", SNIPPET, str(work), str(cache_dir), str(count), str(repeats)], package_root)
    measured = json.loads(result.stdout)
    assert measured["package"].startswith(str(package_root)), measured
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--baseline", metavar="REF", help="also measure git REF's edgebuild, in the same run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgebuild-stat-cache-"))
    try:
        (work / "files").mkdir()
        for index in range(max(SIZES)):
            (work / "files" / f"input-{index:05}.bin").write_bytes(index.to_bytes(4, "little"))
        (work / "build" / "t").mkdir(parents=True)
        for name in ("model.onnx", "model.onnx.data", ".edgebuild.json")[:TASK_OUTPUTS]:
            (work / "build" / "t" / name).write_bytes(b"")
        ways = {"now": common.REPO}
        if args.baseline:
            ways["before"] = baseline_package(args.baseline, work)
        measured = {(way, count): measure(root, work, way, count, args.repeats) for count in SIZES for way, root in ways.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for way in ways:
        small, large = measured[(way, SIZES[0])], measured[(way, SIZES[1])]
        label = "SQLite, a row per file (now)" if way == "now" else f"JSON file at `{args.baseline}` (before)"
        rows.append([label, f"{small['save'] * 1e3:.2f}", f"{large['save'] * 1e3:.2f}", f"{large['save'] / small['save']:.2f}x",
                     f"{small['check'] * 1e3:.2f}", f"{large['check'] * 1e3:.2f}", f"{large['check'] / small['check']:.2f}x"])
    ratio = measured[("now", SIZES[1])]["save"] / measured[("now", SIZES[0])]["save"]
    command_line = f"`.venv/bin/python bench/stat_cache.py --repeats {args.repeats}" + (
        f" --baseline {args.baseline}`" if args.baseline else "`")
    markdown = (
        "## Stat cache upkeep per task at 100 and 10,000 cached files (issue 40: state that scales)\n\n"
        f"{command_line} on {common.machine()}. A worker's save of the entries its task made ({TASK_OUTPUTS} outputs "
        "rewritten and remembered, the connection opened included), then the check of those outputs by the process "
        "that started the worker (it takes the worker's digests, reading none of the files), with a cache that holds "
        f"{SIZES[0]:,}, then {SIZES[1]:,} other files; medians of {args.repeats}, a fresh process per size.\n\n"
        + common.table(["stat cache", f"save, {SIZES[0]:,} cached (ms)", f"save, {SIZES[1]:,} (ms)", f"save, {SIZES[1]:,} vs {SIZES[0]:,}",
                        f"check, {SIZES[0]:,} (ms)", f"check, {SIZES[1]:,} (ms)", f"check, {SIZES[1]:,} vs {SIZES[0]:,}"], rows)
        + f"\n\nGoal (issue 40): saving a task at {SIZES[1]:,} cached files at most {GOAL}x the cost at {SIZES[0]:,}: "
        f"{'met' if ratio <= GOAL else 'not met'} ({ratio:.2f}x).\n"
    )
    print(markdown)
    common.write_section("stat_cache", markdown)


if __name__ == "__main__":
    main()
