"""XNNPACK's pattern graphs, made once in the fork server instead of in every build.

XNNPACK's lowering recognises bilinear upsampling and scaled dot-product attention by
matching the program against small graphs that it exports and lowers itself, the first
time a process asks for them, and keeps for the process (``functools.lru_cache``): 6.6 s
of every ExecuTorch build on 2 cores, whatever the model's size, most of a tiny
model's lowering. The fork server makes them before it forks a build worker (the kind's
``build_imports``: ``prepare.py``), so every build worker forked from it starts with
them; a fresh interpreter makes them when its build asks (:func:`make_patterns`). They
are the same graphs either way (made from nothing but ExecuTorch and torch), so the
lowered bytes are the same.
"""

from __future__ import annotations

from typing import Any

# What a build records of them: made by this process, found made (forked from a server
# that made them), or not there to make (another ExecuTorch, whose lowering makes what it needs).
MADE, INHERITED, UNAVAILABLE = "made", "inherited", "unavailable"


def _caches() -> tuple[Any, ...]:
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa

    return bilinear_2d._get_bilinear_2d_graphs, sdpa.get_graphs


def make_patterns() -> str:
    """Make XNNPACK's pattern graphs in this process, unless it has them; say which
    (:data:`MADE`, :data:`INHERITED` or :data:`UNAVAILABLE`)."""
    try:
        caches = _caches()
        had = all(cache.cache_info().currsize for cache in caches)
    except (ImportError, AttributeError):
        return UNAVAILABLE
    for cache in caches:
        cache()
    return INHERITED if had else MADE
