"""edgebuild: a declarative build system for model artifacts shipped to edge devices.

The package imports nothing heavy at import time (torch, transformers and
onnxruntime are imported inside the functions that need them) so that
``doit list`` stays instant. The Python API (``edgebuild.open_project`` and its
types, from ``edgebuild/api.py``) is imported on first use.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_API = ("ArtifactStatus", "Project", "VerificationReport", "VerifyResult", "fetch", "open_project")
__all__ = ["__version__", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'edgebuild' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
