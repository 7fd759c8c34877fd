"""The artifact kinds: the built-in ones listed in ``edgebuild/kinds/__init__.py``, and
those of other installed packages, declared as entry points of the group
``edgebuild.kinds`` (``name = "package.module:KindClass"``).

Every kind is loaded by name when something first needs it (a manifest names it,
the schema lists it), and checked when it is loaded, the same way for built-in and
plugin kinds. An entry point's name is its kind's name, so a plugin's module is
imported only when a manifest names its kind (or ``schema`` and ``init --plugins``
list every kind): a plugin that imports slowly, or not at all, costs a command that
does not use it nothing. A plugin that fails to import is one line naming its entry
point and the error. The list itself is data (module and class names), not imports:
no module here imports a kind, and adding one makes no other kind's fingerprint change.
"""

from __future__ import annotations

import importlib
import importlib.util
import typing
from dataclasses import dataclass
from importlib import metadata
from typing import Callable

from edgebuild.core.kind import TARGET_NAME, ArtifactKind, ArtifactParams, Fixture, Format, Process, ToolEnvironment
from edgebuild.errors import PluginError

ENTRY_POINT_GROUP = "edgebuild.kinds"
# Where the built-in kinds are listed, as ``BUILTIN_KINDS = {name: "module:Class"}``.
BUILTIN_LIST_MODULE = "edgebuild.kinds"


@dataclass(frozen=True)
class Declaration:
    """Where a kind is declared: its name, ``module:Class``, and for a plugin the
    distribution that declares it (name, version)."""

    name: str
    target: str
    distribution: tuple[str, str] | None = None

    @property
    def origin(self) -> str:
        if self.distribution is None:
            return f"built-in kind {self.name!r} ({self.target})"
        return f"entry point {ENTRY_POINT_GROUP}: {self.name} = {self.target} (from {self.distribution[0]} {self.distribution[1]})"


_declarations: dict[str, Declaration] | None = None
_loaded: dict[str, ArtifactKind] = {}


def declarations() -> dict[str, Declaration]:
    """Every kind there is, built-in first, by name (nothing imported but the list)."""
    global _declarations
    if _declarations is None:
        builtin = importlib.import_module(BUILTIN_LIST_MODULE).BUILTIN_KINDS
        found = {name: Declaration(name, target) for name, target in builtin.items()}
        for point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name):
            distribution = (point.dist.name, point.dist.version) if point.dist is not None else ("?", "?")
            if point.name in found:
                # A plugin never replaces a kind someone else's artifacts were built with.
                continue
            found[point.name] = Declaration(point.name, point.value, distribution)
        _declarations = found
    return _declarations


def kind_names() -> list[str]:
    return sorted(declarations())


def shadowed_plugins() -> list[str]:
    """Entry points that name a kind another declaration already has (ignored)."""
    names = set(importlib.import_module(BUILTIN_LIST_MODULE).BUILTIN_KINDS)
    shadowed = []
    seen: set[str] = set()
    for point in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda point: point.name):
        if point.name in names or point.name in seen:
            shadowed.append(f"{ENTRY_POINT_GROUP}: {point.name} = {point.value}")
        seen.add(point.name)
    return shadowed


def get_kind(name: str) -> ArtifactKind:
    """The kind ``name``, loaded and checked on first use. ``KeyError`` for a name no
    one declares; :class:`~edgebuild.errors.PluginError` (one line) for a kind that
    cannot be imported or does not declare what every kind must."""
    if name in _loaded:
        return _loaded[name]
    declaration = declarations()[name]
    module_name, _, class_name = declaration.target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name) if class_name else None
    except Exception as error:  # a plugin's import may raise anything
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise PluginError(f"{declaration.origin} failed to import: {reason}") from None
    if not isinstance(cls, type) or not issubclass(cls, ArtifactKind):
        raise PluginError(f"{declaration.origin}: expected a subclass of edgebuild.plugin.ArtifactKind, found {cls!r}")
    try:
        check_kind(cls, name)
    except TypeError as error:
        raise PluginError(f"{declaration.origin}: {error}") from None
    kind = cls()
    # The class attribute, not the instance: fingerprints read it from the class too.
    cls.distribution = declaration.distribution
    _loaded[name] = kind
    return kind


def check_kind(cls: type[ArtifactKind], name: str) -> None:
    """What every kind must declare; ``TypeError`` saying what is missing or wrong."""
    for attribute in ("name", "summary", "Params", "outputs", "build_module", "verify_module"):
        if not hasattr(cls, attribute):
            raise TypeError(f"artifact kind {cls.__qualname__} does not declare {attribute!r}")
    if cls.name != name:
        raise TypeError(f"{cls.__qualname__}.name is {cls.name!r}, but it is registered as {name!r}")
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, ArtifactParams)):
        raise TypeError(f"{cls.__qualname__}.Params must subclass ArtifactParams")
    kind_field = cls.Params.model_fields.get("kind")
    allowed = typing.get_args(kind_field.annotation) if kind_field else ()
    if allowed != (cls.name,):
        raise TypeError(f"{cls.__qualname__}.Params.kind must be Literal[{cls.name!r}], found {allowed!r}")
    if not isinstance(cls.outputs, tuple) or not cls.outputs or not all(isinstance(output, str) for output in cls.outputs):
        raise TypeError(f"artifact kind {cls.name!r}: outputs must be a non-empty tuple of file names")
    check_process(cls)
    for attribute in ("build_module", "verify_module"):
        module = getattr(cls, attribute)
        if not _module_exists(module):
            raise TypeError(f"artifact kind {cls.name!r}: {attribute} {module!r} does not exist")
    check_formats(cls)
    if "source" in cls.Params.model_fields and not (cls.consumes or cls.source_kinds):
        raise TypeError(f"artifact kind {cls.name!r} has a 'source' but declares nothing it consumes "
                        "(consumes = (FORMAT, ...))")
    environments = cls.tool_environments
    if not isinstance(environments, tuple) or not all(isinstance(item, ToolEnvironment) for item in environments):
        raise TypeError(f"artifact kind {cls.name!r}: tool_environments must be a tuple of "
                        f"edgebuild.plugin.ToolEnvironment, found {environments!r}")
    for fixture in cls.fixtures:
        if not isinstance(fixture, Fixture):
            raise TypeError(f"artifact kind {cls.name!r}: fixtures must be edgebuild.plugin.Fixture, found {fixture!r}")


def check_process(cls: type[ArtifactKind]) -> None:
    """The kind's ``process`` declaration: a :class:`Process` of the right types."""
    process = cls.process
    if not isinstance(process, Process):
        raise TypeError(f"artifact kind {cls.name!r}: process must be edgebuild.plugin.Process, found {process!r}")
    for attribute in ("worker_imports", "build_imports", "build_warmups", "quiet_loggers"):
        imports = getattr(process, attribute)
        if not isinstance(imports, tuple) or not all(isinstance(module, str) and module for module in imports):
            raise TypeError(f"artifact kind {cls.name!r}: {attribute} must be a tuple of module names, found {imports!r}")
    if not isinstance(process.in_process, bool):
        raise TypeError(f"artifact kind {cls.name!r}: in_process must be True or False, found {process.in_process!r}")
    factor = process.memory_factor
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0):
        raise TypeError(f"artifact kind {cls.name!r}: memory_factor must be a positive number or None, found {factor!r}")


def check_formats(cls: type[ArtifactKind]) -> None:
    """What the kind produces and consumes are formats, the certificates of those it produces
    are named and findable, and the targets it certifies by default are among them: an
    unknown target is an error here, never a certificate quietly left out."""
    for attribute in ("produces", "consumes"):
        formats = getattr(cls, attribute)
        if not isinstance(formats, tuple) or not all(isinstance(form, Format) for form in formats):
            raise TypeError(f"artifact kind {cls.name!r}: {attribute} must be a tuple of edgebuild.plugin.Format, "
                            f"found {formats!r}")
    known: dict[str, str] = {}
    for form in cls.produces:
        for target in form.certificates:
            if not TARGET_NAME.fullmatch(target.name) or target.name == "targets":
                raise TypeError(f"artifact kind {cls.name!r}: format {form.name!r} has a coverage target named "
                                f"{target.name!r}; expected lower case, digits and '_' (and not 'targets')")
            module, _, function = target.certify.partition(":")
            if not function or not _module_exists(module):
                raise TypeError(f"artifact kind {cls.name!r}: coverage target {target.name!r}: certify "
                                f"{target.certify!r} is not 'module:function' of a module that exists")
            if known.setdefault(target.name, target.certify) != target.certify:
                raise TypeError(f"artifact kind {cls.name!r}: two formats it produces declare coverage target "
                                f"{target.name!r} differently")
    unknown = [target for target in cls.coverage_targets if target not in known]
    if not isinstance(cls.coverage_targets, tuple) or unknown:
        raise TypeError(f"artifact kind {cls.name!r}: coverage_targets names "
                        f"{', '.join(map(repr, unknown)) or repr(cls.coverage_targets)}, which no format it produces "
                        f"certifies (its targets: {', '.join(known) or 'none'}: declare the certificate on a format "
                        "in produces)")


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def producers(consumer: ArtifactKind, names: list[str] | None = None) -> list[str]:
    """The kinds (of ``names``; default: built-in and installed, those that load) whose
    artifacts ``consumer`` takes as a source: for a message, when one that is not was named."""
    return [kind.name for kind in all_kinds(on_error=lambda error: None, names=names) if consumer.takes_source_of(kind)]


def all_kinds(on_error: Callable[[PluginError], None] | None = None, names: list[str] | None = None) -> list[ArtifactKind]:
    """Every kind (of ``names``; default: every kind there is) that loads, in name order.
    A plugin that does not load is passed to ``on_error`` (default: raised)."""
    kinds = []
    for name in sorted(kind_names() if names is None else names):
        try:
            kinds.append(get_kind(name))
        except PluginError as error:
            if on_error is None:
                raise
            on_error(error)
    return kinds


def builtin_names() -> list[str]:
    """The built-in kinds' names (nothing imported but the list)."""
    return sorted(importlib.import_module(BUILTIN_LIST_MODULE).BUILTIN_KINDS)


def plugin_names() -> list[str]:
    """The kinds other installed packages declare, by entry point name (nothing imported)."""
    return sorted(name for name, declaration in declarations().items() if declaration.distribution is not None)


def fixtures(names: list[str] | None = None) -> dict[str, Fixture]:
    """Every generated checkpoint the kinds ``names`` (default: every kind) declare, by
    name, for those that load. Two kinds may declare the same one (the same object); a
    plugin that does not load offers none."""
    found: dict[str, Fixture] = {}
    for name in kind_names() if names is None else names:
        try:
            kind = get_kind(name)
        except PluginError:
            continue
        for fixture in kind.fixtures:
            if fixture.name in found and found[fixture.name] is not fixture:
                raise PluginError(f"fixture {fixture.name!r} is declared by two kinds with different generators ({kind.name!r} is one)")
            found[fixture.name] = fixture
    return found


def find_fixture(name: str) -> tuple[Fixture | None, dict[str, Fixture]]:
    """The fixture ``name`` and the fixtures looked through to find it. The kinds loaded
    already (those the manifest names) are asked first: a fixture only built-in kinds among
    them declare is theirs (the built-in kinds agree on each one they share: every kind's
    fixtures are gathered in a test). Importing every built-in kind for it was a tenth of
    a `doit status`. Otherwise the built-in kinds too, so that a plugin's fixture of a
    built-in one's name with another generator is refused; the other plugins are imported
    only when none of those declares it."""
    loaded_names = [kind for kind in _loaded if kind in declarations()]
    loaded = fixtures(loaded_names)
    if name in loaded and not any(declarations()[kind].distribution is not None
                                  and any(fixture.name == name for fixture in _loaded[kind].fixtures)
                                  for kind in loaded_names):
        return loaded[name], loaded
    nearby = fixtures([*builtin_names(), *(loaded for loaded in _loaded if loaded in declarations())])
    if name in nearby:
        return nearby[name], nearby
    everything = fixtures()
    return everything.get(name), everything


def register(cls: type[ArtifactKind]) -> type[ArtifactKind]:
    """Add a kind class defined in this process (a notebook, a test), checked like any
    other; usable as a class decorator. Worker processes do not see it: a kind that
    builds through doit or the Python API is declared in a package."""
    check_kind(cls, getattr(cls, "name", cls.__qualname__))
    if cls.name in declarations():
        raise TypeError(f"artifact kind {cls.name!r} is declared already ({declarations()[cls.name].origin})")
    declarations()[cls.name] = Declaration(cls.name, f"{cls.__module__}:{cls.__qualname__}", ("this process", "-"))
    _loaded[cls.name] = cls()
    return cls


def unregister(name: str) -> None:
    """Forget a kind added with :func:`register`."""
    declarations().pop(name, None)
    _loaded.pop(name, None)


def reset() -> None:
    """Forget what was found and loaded (tests that install a plugin mid-session)."""
    global _declarations
    _declarations = None
    _loaded.clear()
