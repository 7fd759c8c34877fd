"""Run every benchmark in turn and regenerate BENCHMARKS.md.

    .venv/bin/python bench/run_all.py

Run on a quiet machine: the numbers are ratios measured within each run, but a
second busy process still skews them. Takes about half an hour on two cores
(writing the 9 GB synthetic checkpoint and exporting the full-size tower
dominate). EDGEBUILD_BENCH_DIR sets where the multi-GB inputs live.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "noop_fingerprint.py", "tower_export.py", "qdq_tower.py", "siglip_gptq.py", "store_copy.py", "parallel_matrix.py",
    "worker_memory.py", "worker_startup.py", "wrapper_check_dtype.py", "scale_matrix.py", "many_artifacts.py", "verify_many.py",
    "cache_pull.py", "peers.py", "dataset_gate.py", "targets.py", "stat_cache.py", "exporter_warmup.py",
    "latency_vs_tools.py",
]


def main() -> int:
    for script in BENCHMARKS:
        print(f"== {script}", flush=True)
        result = subprocess.run([sys.executable, str(HERE / script)])
        if result.returncode != 0:
            print(f"{script} failed ({result.returncode})", file=sys.stderr)
            return result.returncode
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
