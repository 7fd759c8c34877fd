"""The registry of artifact kinds: ``@register`` checks a kind's declaration and adds it.

Apart from ``kinds/__init__.py`` (which lists the kinds) so that a kind imports
the registry without importing every other kind, and no import cycle forms.
"""

from __future__ import annotations

import importlib.util
import typing

from edgebuild.core.kind import ArtifactKind, ArtifactParams

_KINDS: dict[str, ArtifactKind] = {}


def register(cls: type[ArtifactKind]) -> type[ArtifactKind]:
    """Class decorator: validate the kind's declaration and add it to the registry."""
    for attribute in ("name", "summary", "Params", "outputs", "build_module", "verify_module"):
        if not hasattr(cls, attribute):
            raise TypeError(f"artifact kind {cls.__qualname__} does not declare {attribute!r}")
    if not issubclass(cls.Params, ArtifactParams):
        raise TypeError(f"{cls.__qualname__}.Params must subclass ArtifactParams")
    kind_field = cls.Params.model_fields.get("kind")
    allowed = typing.get_args(kind_field.annotation) if kind_field else ()
    if allowed != (cls.name,):
        raise TypeError(f"{cls.__qualname__}.Params.kind must be Literal[{cls.name!r}], found {allowed!r}")
    if cls.name in _KINDS:
        raise TypeError(f"artifact kind {cls.name!r} is registered twice")
    for attribute in ("build_module", "verify_module"):
        module = getattr(cls, attribute)
        if importlib.util.find_spec(module) is None:
            raise TypeError(f"artifact kind {cls.name!r}: {attribute} {module!r} does not exist")
    if "source" in cls.Params.model_fields and not cls.source_kinds:
        raise TypeError(f"artifact kind {cls.name!r} has a 'source' but declares no source_kinds")
    _KINDS[cls.name] = cls()
    return cls


def get_kind(name: str) -> ArtifactKind:
    return _KINDS[name]


def kind_names() -> list[str]:
    return sorted(_KINDS)
