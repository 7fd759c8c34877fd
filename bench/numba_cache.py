"""The F143/GPTQ kernels' compile cost, and what caching them under cache/ saves.

    .venv/bin/python bench/numba_cache.py [--repeats 3]

Each measurement is a fresh process reconstructing one 384x256 linear with GPTQ
(every kernel runs once): first with an empty NUMBA_CACHE_DIR (what a fresh clone
or a fresh worker pays), then again with the cache that run left (what every later
process pays). The difference is the compile time a per-build worker process
would pay each time if the kernels were not cached where every process finds them.
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
import time
from pathlib import Path

SNIPPET = """
import json, time
started = time.perf_counter()
import torch
from edgebuild.ml.quant import gptq
generator = torch.Generator().manual_seed(0)
weight = torch.randn(384, 256, generator=generator)
inputs = torch.randn(512, 256, generator=generator)
state = gptq.accumulate_block_hessians(gptq.empty_block_hessians(256), inputs)
imported = time.perf_counter()
gptq.reconstruct(weight, state.hessians, algorithm="gptq")
print(json.dumps({"import_s": imported - started, "reconstruct_s": time.perf_counter() - imported}))
"""


def run_once(cache: Path) -> dict[str, float]:
    environment = dict(os.environ, NUMBA_CACHE_DIR=str(cache))
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", SNIPPET], env=environment, capture_output=True, text=True, check=True)
    measured = json.loads(result.stdout)
    measured["process_s"] = time.perf_counter() - started
    return measured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cold, warm = [], []
    for _ in range(args.repeats):
        cache = Path(tempfile.mkdtemp(prefix="numba-cache-"))
        try:
            cold.append(run_once(cache))
            warm.append(run_once(cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    rows = [
        ("empty cache (fresh clone, or a worker without the cache)", cold),
        ("cache left by the first process (cache/numba)", warm),
    ]
    print("| process | reconstruct (s), median | whole process (s), median |")
    print("| --- | --- | --- |")
    for label, runs in rows:
        print(f"| {label} | {statistics.median(r['reconstruct_s'] for r in runs):.2f} | "
              f"{statistics.median(r['process_s'] for r in runs):.2f} |")
    saved = statistics.median(r["reconstruct_s"] for r in cold) / statistics.median(r["reconstruct_s"] for r in warm)
    print(f"\ncompiled once instead of per process: reconstruction {saved:.1f}x faster with the cache ({args.repeats} runs each)")


if __name__ == "__main__":
    main()
