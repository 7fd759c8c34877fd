"""What the fork server imports before it forks an ``executorch`` build worker (the
kind's ``build_imports``): importing it makes XNNPACK's pattern graphs (``patterns.py``),
on one torch thread (``edgebuild/ml/prepare.py`` says why)."""

from __future__ import annotations

from edgebuild.ml.prepare import one_torch_thread

from .patterns import make_patterns

with one_torch_thread():
    make_patterns()
