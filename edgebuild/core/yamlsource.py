"""YAML with positions: every key and value remembers the line it came from.

PyYAML's ``safe_load`` forgets positions and silently lets a repeated key win.
Here the document is composed into nodes first, so that an error can say
``artifacts.yaml:12:5: artifacts -> tower -> image_size: ...`` and a duplicate
key is an error instead of a surprise. Every problem with the input is a
:class:`ManifestError` naming the file, line, column and key path.

Values are plain data: mappings, lists, strings, integers, floats, booleans and
null. Other YAML types (dates, binary, sets, custom tags) are errors, so that
nothing later meets a value it cannot compare, hash or write as JSON.

Aliases and merge keys
    ``*name`` is replaced by a copy of the node anchored ``&name``. ``<<: *base``
    (or ``<<: [*first, *second]``) merges mappings as the YAML merge-key type
    says: keys written in the mapping win over merged ones, and an earlier
    mapping in the list wins over a later one. A repeated ``<<`` is a duplicate
    key, like any other.

    Copies are made where they are used, so the size of the result is bounded:
    at most :data:`MAX_VALUES` values copied by aliases and merge keys in all (an
    "alias bomb" of nested aliases stops there instead of running for minutes;
    values written out plainly are not counted, the file's size bounds them) and
    at most :data:`MAX_DEPTH` levels of nesting. An alias inside the node it refers to (``a: &a [*a]``)
    is an error.

Environment variables, in string values (not keys)
    ``${NAME}`` is the variable's value; an unset or empty variable is an error.
    ``${NAME:-default}`` is the value, or ``default`` when the variable is unset
    or empty. ``$$`` is a literal ``$``, also inside a default; any other ``$``
    is literal too. NAME is letters, digits and ``_``, not starting with a digit;
    a default runs to the first ``}`` and cannot contain ``${``. Any other use
    of ``${`` (unterminated, empty, nested, a bad name, an operator other than
    ``:-``) is an error.

    A plain scalar (unquoted, untagged) that is exactly one ``${...}`` is typed
    after substitution as if its result had been written there:
    ``image_size: ${SIZE:-448}`` is the integer 448, ``${FLAG:-true}`` a boolean,
    ``${X:-}`` null. The result is only ever a scalar (never a list or mapping).
    Quote it (``"${SIZE}"``) to keep a string; any other string stays a string.

Integers have at most :data:`MAX_INTEGER_DIGITS` digits. No setting needs more,
and beyond about 4300 digits Python refuses to convert an integer to or from
text, which would break reading it and every message that quotes it. Tighter,
per-field bounds are each schema's business.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from edgebuild.errors import ManifestError
from edgebuild.core.files import MANIFEST_BYTES, UnreadableFile, read_bytes

KeyPath = tuple[Any, ...]

# Values copied by aliases and merge keys in all, each use counted in full. Values
# written out plainly are bounded by the manifest's size, not by this: a manifest
# of thousands of plain artifacts is not an alias bomb.
MAX_VALUES = 50_000
# Levels of nested mappings and lists.
MAX_DEPTH = 64
MAX_INTEGER_DIGITS = 100
_INTEGER_LIMIT = 10**MAX_INTEGER_DIGITS

_TAG = "tag:yaml.org,2002:"
_MAPPING_TAG = _TAG + "map"
_SEQUENCE_TAG = _TAG + "seq"
_MERGE_TAG = _TAG + "merge"
_INTEGER_TAG = _TAG + "int"
_TIMESTAMP_TAG = _TAG + "timestamp"
# The scalar tags whose values are plain data, and what a message calls them.
_SCALAR_KINDS = {
    _TAG + "str": "a string",
    _INTEGER_TAG: "an integer",
    _TAG + "float": "a number",
    _TAG + "bool": "a boolean",
    _TAG + "null": "null",
}
_DECIMAL_INTEGER = re.compile(r"[-+]?[0-9][0-9_]*")

# ``$$``, or ``${`` up to the next ``}`` (an empty ``close`` means there is none).
_DOLLAR = re.compile(r"\$\$|\$\{(?P<body>[^}]*)(?P<close>\}?)")
_ESCAPE_OR_NESTING = re.compile(r"\$\$|\$\{")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_INTERPOLATION_FORMS = "expected ${NAME} or ${NAME:-default} ('$$' for a literal '$')"

_PREVIEW_LENGTH = 40


@dataclass
class SourceMap:
    """Where each key path of a YAML document was written."""

    file: Path
    positions: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        """``file:line:column`` of the deepest known prefix of ``path``."""
        for end in range(len(path), -1, -1):
            position = self.positions.get(tuple(path[:end]))
            if position is not None:
                line, column = position
                return f"{self.file}:{line}:{column}"
        return str(self.file)


def format_key_path(path: KeyPath) -> str:
    return " -> ".join(_key_text(part) for part in path) if path else "(top level)"


def _key_text(part: Any) -> str:
    """A key as a message shows it: quoted when it would not read back as written
    (empty, padded, or holding a newline or other unprintable character)."""
    if isinstance(part, str) and not (part and part.isprintable() and part == part.strip()):
        return repr(part)
    return str(part)


def load_yaml(path: Path, environ: dict[str, str] | None = None) -> tuple[Any, SourceMap]:
    """Parse ``path`` into plain Python values plus a :class:`SourceMap`.

    ``${VAR}`` and ``${VAR:-default}`` in string values are replaced from
    ``environ`` (the process environment by default); see the module docstring.
    """
    environ = dict(os.environ) if environ is None else environ
    text = _read_text(path)
    source = SourceMap(path)
    try:
        loader = _PositionedLoader(text, path)
    except yaml.reader.ReaderError as error:
        # The reader checks the whole text for unprintable characters before parsing.
        line, column = _line_and_column(text, error.position)
        raise ManifestError(
            f"{path}:{line}:{column}: invalid YAML: found the unprintable character "
            f"#x{error.character:04x}; expected printable text"
        ) from None
    try:
        node = loader.get_single_node()
        if node is None:
            raise ManifestError(f"{path}:1:1: (top level): expected a mapping, found an empty manifest")
        value = _ValueBuilder(loader, source, environ).build(node, ())
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        location = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        # The context says what the problem is about ("found duplicate anchor 'a';
        # first occurrence"), and where that began.
        context = (
            f" ({error.context} on line {error.context_mark.line + 1})"
            if error.context and error.context_mark
            else ""
        )
        raise ManifestError(f"{location}: invalid YAML: {error.problem}{context}") from None
    finally:
        loader.dispose()
    return value, source


def _read_text(path: Path) -> str:
    try:
        data = read_bytes(path, MANIFEST_BYTES)
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest not found") from None
    except UnreadableFile as error:
        raise ManifestError(f"{path}: cannot read manifest: {error}; expected a YAML file") from None
    except OSError as error:
        raise ManifestError(f"{path}: cannot read manifest: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        # Everything before the bad byte decoded, so its line decodes up to it.
        line_start = data.rfind(b"\n", 0, error.start) + 1
        line = data.count(b"\n", 0, error.start) + 1
        column = len(data[line_start:error.start].decode("utf-8")) + 1
        raise ManifestError(
            f"{path}:{line}:{column}: invalid UTF-8 at byte {error.start} "
            f"(0x{data[error.start]:02x}: {error.reason}); expected a UTF-8 text file"
        ) from None


def _line_and_column(text: str, offset: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, offset) + 1
    return text.count("\n", 0, offset) + 1, offset - line_start + 1


def _line_column(mark: yaml.Mark) -> tuple[int, int]:
    """PyYAML counts lines and columns from 0; messages count from 1."""
    return mark.line + 1, mark.column + 1


def _at(file: Path, mark: yaml.Mark) -> str:
    line, column = _line_column(mark)
    return f"{file}:{line}:{column}"


@dataclass(eq=False)
class _Alias:
    """A use of ``*anchor``: PyYAML's composer splices in the anchored node itself,
    which forgets where the alias was written."""

    anchor: str
    target: yaml.Node
    start_mark: yaml.Mark


def _target(node: yaml.Node | _Alias) -> yaml.Node:
    return node.target if isinstance(node, _Alias) else node


class _PositionedLoader(yaml.SafeLoader):
    """A SafeLoader whose composer keeps aliases as :class:`_Alias`, bounds nesting
    (the composer recurses once per level), and notes which scalars were plain and
    untagged (typed by their text, so an interpolated one is typed again)."""

    def __init__(self, text: str, file: Path) -> None:
        super().__init__(text)
        self.file = file
        self.plain_untagged_scalars: set[yaml.ScalarNode] = set()
        self._composing: list[Any] = []

    def compose_node(self, parent: yaml.Node | None, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            return _Alias(event.anchor, super().compose_node(parent, index), event.start_mark)
        if parent is not None:
            self._composing.append(_composed_key(parent, index))
        if len(self._composing) > MAX_DEPTH:
            raise ManifestError(
                f"{_at(self.file, self.peek_event().start_mark)}: {format_key_path(tuple(self._composing))}: "
                f"nested more than {MAX_DEPTH} levels deep; expected at most {MAX_DEPTH}"
            )
        node = super().compose_node(parent, index)
        if parent is not None:
            self._composing.pop()
        return node

    def compose_scalar_node(self, anchor: str | None) -> yaml.ScalarNode:
        plain_untagged = self.peek_event().implicit[0]
        node = super().compose_scalar_node(anchor)
        if plain_untagged:
            self.plain_untagged_scalars.add(node)
        return node


def _composed_key(parent: yaml.Node, index: Any) -> Any:
    """The key path part of a node being composed: PyYAML passes a sequence item's
    index, a mapping value's key node, or None for a mapping key."""
    if isinstance(parent, yaml.SequenceNode):
        return index
    key = _target(index) if index is not None else None
    return key.value if isinstance(key, yaml.ScalarNode) else "(key)"


@dataclass(frozen=True)
class _Entry:
    """A key of a mapping node: where the key was written, its value node, and the
    ``<<`` that merged it in (None when written in the mapping itself)."""

    key_mark: yaml.Mark
    value: yaml.Node | _Alias
    merged_at: yaml.Mark | None = None


@dataclass(frozen=True)
class _Reference:
    """``${name}`` (``default`` None) or ``${name:-default}``."""

    name: str
    default: str | None


class _BadInterpolation(Exception):
    """What is wrong with a ``${...}``; the caller adds where it is."""


class _ValueBuilder:
    """Turns composed nodes into plain values, recording each key path's position.

    An error ends the whole load, so the bookkeeping below is not unwound on the
    way out.
    """

    def __init__(self, loader: _PositionedLoader, source: SourceMap, environ: dict[str, str]) -> None:
        self.loader = loader
        self.source = source
        self.environ = environ
        self.values_copied = 0
        # Alias and merge-key uses being copied, outermost first: (where written, key path).
        self.expansions: list[tuple[yaml.Mark, KeyPath]] = []
        # Mappings and lists being built: meeting one again means an alias loops.
        self.building: set[yaml.Node] = set()
        # The entries of each mapping node (merges resolved), computed once per node,
        # so that merging a mapping many times costs no more than copying its values.
        self.entries_of: dict[yaml.MappingNode, dict[Any, _Entry]] = {}
        self.collecting_entries: set[yaml.MappingNode] = set()

    def build(self, node: yaml.Node | _Alias, path: KeyPath) -> Any:
        if isinstance(node, _Alias):
            value = self._expand(node.target, path, node.start_mark, f"alias *{node.anchor}")
            self.source.positions[path] = _line_column(node.start_mark)
            return value
        self._count(node, path)
        self.source.positions[path] = _line_column(node.start_mark)
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode):
            return self._sequence(node, path)
        return self._scalar_value(node, path)

    def _error(self, mark: yaml.Mark, path: KeyPath, message: str) -> ManifestError:
        return ManifestError(f"{_at(self.source.file, mark)}: {format_key_path(path)}: {message}")

    def _recursive(self, mark: yaml.Mark, path: KeyPath, what: str) -> ManifestError:
        return self._error(
            mark, path,
            f"{what} is inside the node it refers to; expected it outside that node "
            "(recursive aliases are not supported)",
        )

    def _expand(self, node: yaml.Node | _Alias, path: KeyPath, mark: yaml.Mark, what: str) -> Any:
        """Build a copy of ``node`` for the alias or merge key written at ``mark``."""
        if node in self.building:
            raise self._recursive(mark, path, what)
        self.expansions.append((mark, path))
        value = self.build(node, path)
        self.expansions.pop()
        return value

    def _count(self, node: yaml.Node, path: KeyPath) -> None:
        if self.expansions:
            self.values_copied += 1
        if self.values_copied <= MAX_VALUES and len(path) <= MAX_DEPTH:
            return
        # Point at the outermost alias being copied: that is what the reader wrote
        # in the document's own tree.
        mark, at = self.expansions[0] if self.expansions else (node.start_mark, path)
        if self.values_copied > MAX_VALUES:
            raise self._error(
                mark, at,
                f"aliases and merge keys copy more than {MAX_VALUES} values (each use counted "
                f"in full); expected at most {MAX_VALUES} copied values",
            )
        raise self._error(
            mark, at,
            f"nested more than {MAX_DEPTH} levels deep once aliases are copied; expected at most {MAX_DEPTH}",
        )

    def _sequence(self, node: yaml.SequenceNode, path: KeyPath) -> list[Any]:
        self._check_collection_tag(node, path, _SEQUENCE_TAG, "a list")
        self.building.add(node)
        items = [self.build(item, (*path, index)) for index, item in enumerate(node.value)]
        self.building.discard(node)
        return items

    def _mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[Any, Any]:
        self._check_collection_tag(node, path, _MAPPING_TAG, "a mapping")
        self.building.add(node)
        mapping: dict[Any, Any] = {}
        for key, entry in self._entries(node, path).items():
            key_path = (*path, key)
            if entry.merged_at is None:
                mapping[key] = self.build(entry.value, key_path)
            else:
                mapping[key] = self._expand(entry.value, key_path, entry.merged_at, "merge key '<<'")
            # An error about a key points at the key, not at its (possibly nested) value.
            self.source.positions[key_path] = _line_column(entry.key_mark)
        self.building.discard(node)
        return mapping

    def _check_collection_tag(self, node: yaml.Node, path: KeyPath, plain_tag: str, kind: str) -> None:
        if node.tag != plain_tag:
            raise self._error(
                node.start_mark, path, f"found {kind} tagged {_short_tag(node.tag)}; expected an untagged one"
            )

    def _entries(self, node: yaml.MappingNode, path: KeyPath) -> dict[Any, _Entry]:
        """The keys of a mapping node, merged ones first, each written key overriding."""
        known = self.entries_of.get(node)
        if known is not None:
            return known
        self.collecting_entries.add(node)
        written: dict[Any, _Entry] = {}
        merged: dict[Any, _Entry] = {}
        merge_mark: yaml.Mark | None = None
        for key_node, value_node in node.value:
            key_mark = key_node.start_mark
            key_node = _target(key_node)
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == _MERGE_TAG:
                if merge_mark is not None:
                    raise self._error(
                        key_mark, (*path, "<<"), f"duplicate key (first defined on line {merge_mark.line + 1})"
                    )
                merge_mark = key_mark
                merged = self._merged_entries(value_node, path, key_mark)
                continue
            key = self._key(key_node, key_mark, path)
            if key in written:
                raise self._error(
                    key_mark, (*path, key),
                    f"duplicate key (first defined on line {written[key].key_mark.line + 1})",
                )
            written[key] = _Entry(key_mark, value_node)
        entries = {**merged, **written}
        self.collecting_entries.discard(node)
        self.entries_of[node] = entries
        return entries

    def _merged_entries(self, value: yaml.Node | _Alias, path: KeyPath, merge_mark: yaml.Mark) -> dict[Any, _Entry]:
        """The entries that ``<<: value`` brings in; an earlier mapping in a list wins."""
        sources = _target(value).value if isinstance(_target(value), yaml.SequenceNode) else [value]
        merged: dict[Any, _Entry] = {}
        for source in sources:
            mapping = _target(source)
            if not isinstance(mapping, yaml.MappingNode):
                raise self._error(
                    source.start_mark, (*path, "<<"),
                    f"expected a mapping or a list of mappings to merge, found {_node_kind(mapping)}",
                )
            # Only an alias can refer back to a mapping that is still being read.
            if isinstance(source, _Alias) and (mapping in self.collecting_entries or mapping in self.building):
                raise self._recursive(source.start_mark, (*path, "<<"), f"alias *{source.anchor}")
            for key, entry in self._entries(mapping, path).items():
                merged.setdefault(key, replace(entry, merged_at=merge_mark))
        return merged

    def _key(self, node: yaml.Node, mark: yaml.Mark, path: KeyPath) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self._error(mark, path, f"expected a string, number or boolean as a key, found {_node_kind(node)}")
        key = self._scalar(node, path)
        if key is None:
            raise self._error(mark, path, "expected a string, number or boolean as a key, found null")
        return key

    def _scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        """The value of a scalar node as YAML types it, limited to plain data."""
        kind = _SCALAR_KINDS.get(node.tag)
        if kind is None:
            hint = " (quote it to make it a string)" if node.tag == _TIMESTAMP_TAG else ""
            raise self._error(
                node.start_mark, path,
                f"found {_tag_kind(node.tag)} {_preview(node.value)}; "
                f"expected a string, number, boolean or null{hint}",
            )
        try:
            value = self.loader.construct_object(node)
        except (ValueError, LookupError):
            # PyYAML's scalar constructors let Python's conversion errors through: an
            # explicit ``!!int abc`` or ``!!bool maybe``, or a decimal integer with more
            # digits than int() converts.
            if node.tag == _INTEGER_TAG and _DECIMAL_INTEGER.fullmatch(node.value):
                raise self._too_large(node, path) from None
            raise self._error(node.start_mark, path, f"expected {kind}, found {_preview(node.value)}") from None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= _INTEGER_LIMIT:
            raise self._too_large(node, path)
        return value

    def _too_large(self, node: yaml.ScalarNode, path: KeyPath) -> ManifestError:
        return self._error(
            node.start_mark, path,
            f"found an integer of more than {MAX_INTEGER_DIGITS} digits, {_preview(node.value)}; "
            f"expected at most {MAX_INTEGER_DIGITS} digits",
        )

    def _scalar_value(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        value = self._scalar(node, path)
        if not isinstance(value, str) or "$" not in value:
            return value
        try:
            parts = _interpolation_parts(value)
        except _BadInterpolation as error:
            raise self._error(
                node.start_mark, path, f"bad ${{...}} in {value!r}: {error}; {_INTERPOLATION_FORMS}"
            ) from None
        text = "".join(part if isinstance(part, str) else self._substitute(part, node, path) for part in parts)
        if node in self.loader.plain_untagged_scalars and len(parts) == 1 and isinstance(parts[0], _Reference):
            tag = self.loader.resolve(yaml.ScalarNode, text, (True, False))
            return self._scalar(yaml.ScalarNode(tag, text, node.start_mark, node.end_mark), path)
        return text

    def _substitute(self, reference: _Reference, node: yaml.ScalarNode, path: KeyPath) -> str:
        found = self.environ.get(reference.name)
        if found:
            return found
        if reference.default is not None:
            return reference.default
        state = "is empty" if found == "" else "is not set"
        raise self._error(
            node.start_mark, path,
            f"environment variable {reference.name} {state} "
            f"(write ${{{reference.name}:-default}} to give a default)",
        )


def _interpolation_parts(text: str) -> list[str | _Reference]:
    """``text`` as literal strings and ``${...}`` references, ``$$`` unescaped."""
    parts: list[str | _Reference] = []
    position = 0
    for match in _DOLLAR.finditer(text):
        parts.append(text[position:match.start()])
        parts.append("$" if match.group() == "$$" else _reference(match))
        position = match.end()
    parts.append(text[position:])
    return [part for part in parts if part != ""]


def _reference(match: re.Match[str]) -> _Reference:
    body = match["body"]
    if not match["close"]:
        raise _BadInterpolation("'${' is not closed by '}'")
    if not body:
        raise _BadInterpolation("'${}' names no variable")
    # The name is the longest one at the start; only ":-default" may follow it.
    name = _VARIABLE_NAME.match(body)
    if name is None:
        raise _BadInterpolation(
            f"{body!r} is not a variable name (letters, digits and '_', not starting with a digit)"
        )
    after_name = body[name.end():]
    if not after_name:
        return _Reference(name.group(), None)
    if not after_name.startswith(":-"):
        raise _BadInterpolation(f"only ':-default' may follow the variable name, found {after_name!r}")

    def unescape(escape: re.Match[str]) -> str:
        if escape.group() == "${":
            raise _BadInterpolation("a default cannot contain '${' (nesting is not supported)")
        return "$"

    return _Reference(name.group(), _ESCAPE_OR_NESTING.sub(unescape, after_name[2:]))


def _node_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return _SCALAR_KINDS.get(node.tag) or _tag_kind(node.tag)


def _tag_kind(tag: str) -> str:
    return {_TIMESTAMP_TAG: "a date", _TAG + "binary": "binary data", _MERGE_TAG: "a merge key"}.get(
        tag, f"a value tagged {_short_tag(tag)}"
    )


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag


def _preview(text: str) -> str:
    """``text`` quoted, shortened when long: messages quote what they found."""
    if len(text) <= _PREVIEW_LENGTH:
        return repr(text)
    return f"{text[:_PREVIEW_LENGTH]!r}... ({len(text)} characters)"
