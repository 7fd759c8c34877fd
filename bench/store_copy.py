"""The store's copy of a just-built file: written past the page cache vs an in-kernel copy.

    .venv/bin/python bench/store_copy.py [--gib 1.6] [--rounds 5]

What a build does after it wrote its outputs: each is copied into a store blob
(``edgebuild/cache/copying.py``). A round writes a fresh file of ``--gib`` GiB of
random bytes (as a build leaves its weights: just written, in the page cache),
then copies it into a new blob both ways, the order alternating between rounds:
``copy_file(cold=True)`` (the store's copy: ``O_DIRECT`` writes) and
``copy_file(cold=False)`` (``copy_file_range``, the store's copy before). The
speed-up is the median of the rounds' ratios, and every copy is compared with its
source byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

sys.path.insert(0, str(common.REPO))
from edgebuild.cache.copying import copy_file  # noqa: E402


def fresh_source(path: Path, size: int) -> None:
    chunk = os.urandom(64 << 20)
    with open(path, "wb") as writer:
        remaining = size
        while remaining > 0:
            remaining -= writer.write(chunk[: min(remaining, len(chunk))])


def timed_copy(source: Path, target: Path, cold: bool) -> tuple[float, str]:
    started = time.perf_counter()
    how = copy_file(source, target, cold=cold)
    elapsed = time.perf_counter() - started
    assert filecmp.cmp(source, target, shallow=False), f"{target} differs from {source}"
    target.unlink()
    return elapsed, how


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=1.6)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = common.work_dir() / "store_copy"
    work.mkdir(parents=True, exist_ok=True)
    size = int(args.gib * 2**30)
    source = work / "model.safetensors"
    rounds = []
    for index in range(args.rounds):
        fresh_source(source, size)
        order = (True, False) if index % 2 == 0 else (False, True)
        times = {}
        for cold in order:
            times[cold] = timed_copy(source, work / "blob", cold)
        rounds.append(times)
        print(f"round {index + 1}: cold {times[True][0]:.2f} s ({times[True][1]}), "
              f"buffered {times[False][0]:.2f} s ({times[False][1]})", flush=True)
    source.unlink()

    cold_s = statistics.median(entry[True][0] for entry in rounds)
    buffered_s = statistics.median(entry[False][0] for entry in rounds)
    ratios = [entry[False][0] / entry[True][0] for entry in rounds]
    routes = sorted({entry[True][1] for entry in rounds}), sorted({entry[False][1] for entry in rounds})
    rows = [
        ["the store's copy (`cold=True`)", ", ".join(routes[0]), f"{cold_s:.2f}", f"{size / cold_s / 1e9:.2f}"],
        ["in-kernel copy (`cold=False`, before)", ", ".join(routes[1]), f"{buffered_s:.2f}", f"{size / buffered_s / 1e9:.2f}"],
    ]
    markdown = f"""## The store's copy of a fresh build output (issue: performance)

`.venv/bin/python bench/store_copy.py --gib {args.gib} --rounds {args.rounds}` on {common.machine()}.
Each round writes a new {args.gib} GiB file (a build's weights, just written) and copies it into a new file both
ways, in alternating order; every copy is compared byte for byte with its source. Medians over the rounds; the
speed-up is the median of the rounds' own ratios: **{statistics.median(ratios):.2f}x**
(rounds: {', '.join(f'{ratio:.2f}x' for ratio in ratios)}).

{common.table(["copy", "route taken", "seconds", "GB/s"], rows)}

A buffered copy allocates a page-cache page per 4 KiB of the blob. On this virtual machine memory the guest
freed is handed back to the host (virtio-balloon free page reporting), so those pages are faulted in afresh from
the host, and that, not the disk, sets the speed; written with `O_DIRECT` the blob skips the page cache. On a
filesystem with reflinks (btrfs, XFS) both routes clone instead, and neither copies.
"""
    common.write_section("store_copy", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
