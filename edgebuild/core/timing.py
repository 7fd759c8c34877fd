"""Wall time per phase of a build or verification, and peak memory: for the build record
and the report, never for a payload file (timings differ run to run)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator


class Phases:
    """``with phases.time("export"): ...`` adds ``export_s`` to ``phases.seconds``
    (accumulating when a phase runs more than once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            key = f"{name}_s"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - started


def peak_rss_bytes() -> int:
    """The largest resident set this process has had so far, in bytes."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux counts kibibytes, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)
