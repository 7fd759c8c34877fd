"""The artifact kinds, listed explicitly: nothing is discovered by walking modules
for a name pattern. Adding a kind is one package plus one import line here."""

from __future__ import annotations

from edgebuild.core.registry import get_kind, kind_names, register

__all__ = ["get_kind", "kind_names", "register"]

# The registration list: one line per kind.
from . import qnn_context  # noqa: E402,F401
from . import qwen3_5_tower  # noqa: E402,F401
from . import qwen3_5_tower_qdq  # noqa: E402,F401
from . import siglip_f143  # noqa: E402,F401
from . import siglip_f143_onnx  # noqa: E402,F401
