"""The registry of artifact kinds.

Kinds register themselves with ``@register`` and are listed explicitly below:
nothing is discovered by walking modules for a name pattern. Adding a kind is
one module plus one import line here.
"""

from __future__ import annotations

import typing

from .base import ArtifactKind, ArtifactParams

_KINDS: dict[str, ArtifactKind] = {}


def register(cls: type[ArtifactKind]) -> type[ArtifactKind]:
    """Class decorator: validate the kind's declaration and add it to the registry."""
    for attribute in ("name", "summary", "Params", "outputs"):
        if not hasattr(cls, attribute):
            raise TypeError(f"artifact kind {cls.__qualname__} does not declare {attribute!r}")
    if not issubclass(cls.Params, ArtifactParams):
        raise TypeError(f"{cls.__qualname__}.Params must subclass ArtifactParams")
    kind_field = cls.Params.model_fields.get("kind")
    allowed = typing.get_args(kind_field.annotation) if kind_field else ()
    if allowed != (cls.name,):
        raise TypeError(
            f"{cls.__qualname__}.Params.kind must be Literal[{cls.name!r}], found {allowed!r}"
        )
    if cls.name in _KINDS:
        raise TypeError(f"artifact kind {cls.name!r} is registered twice")
    if cls.build is ArtifactKind.build or cls.verify is ArtifactKind.verify:
        raise TypeError(f"artifact kind {cls.name!r} must implement build and verify")
    _KINDS[cls.name] = cls()
    return cls


def get_kind(name: str) -> ArtifactKind:
    return _KINDS[name]


def kind_names() -> list[str]:
    return sorted(_KINDS)


def all_kinds() -> list[ArtifactKind]:
    return [_KINDS[name] for name in kind_names()]


# The registration list: one line per kind.
from . import qwen3_5_tower  # noqa: E402,F401
from . import siglip_f143  # noqa: E402,F401
from . import siglip_f143_onnx  # noqa: E402,F401
