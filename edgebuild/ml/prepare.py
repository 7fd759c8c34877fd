"""Work a fork server does once, before it forks build workers, instead of each build.

The kinds' ``build_imports`` import the modules that do it
(``edgebuild/kinds/executorch/prepare.py``).

Such work runs torch on one thread: a process that has started OpenMP's threads and then
forks leaves the child hanging at its first parallel region (measured with torch 2.13's
CPU wheel: a matrix product in the parent, then one in the forked child, never returns).
On one thread torch starts none; the thread count is put back after, and a worker forked
later starts its own threads when it first needs them.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch (and the BLAS under it) on one thread within the block."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
