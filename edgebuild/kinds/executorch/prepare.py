"""What the fork server imports before it forks an ``executorch`` build worker (the
kind's ``build_imports``): importing it makes XNNPACK's pattern graphs (``patterns.py``)."""

from __future__ import annotations

from .patterns import make_patterns

make_patterns()
