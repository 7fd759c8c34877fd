"""YAML with positions: every key and value remembers the line it came from.

PyYAML's ``safe_load`` forgets positions and silently lets a repeated key win.
Here the document is composed into nodes first, so that an error can say
``artifacts.yaml:12:5`` and a duplicate key is an error instead of a surprise.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ManifestError

KeyPath = tuple[Any, ...]

_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


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
    return " -> ".join(str(part) for part in path) if path else "(top level)"


def load_yaml(path: Path, environ: dict[str, str] | None = None) -> tuple[Any, SourceMap]:
    """Parse ``path`` into plain Python values plus a :class:`SourceMap`.

    ``${VAR}`` and ``${VAR:-default}`` in string values are replaced from
    ``environ`` (the process environment by default); ``$$`` is a literal ``$``.
    """
    environ = dict(os.environ) if environ is None else environ
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(f"{path}: manifest not found") from None
    except OSError as error:
        raise ManifestError(f"{path}: cannot read manifest: {error.strerror}") from None
    source = SourceMap(path)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ManifestError(f"{path}: the manifest is empty")
        value = _construct(loader, node, (), source, environ)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        location = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ManifestError(f"{location}: invalid YAML: {error.problem}") from None
    finally:
        loader.dispose()
    return value, source


def _construct(
    loader: yaml.SafeLoader,
    node: yaml.Node,
    path: KeyPath,
    source: SourceMap,
    environ: dict[str, str],
) -> Any:
    source.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                raise ManifestError(
                    f"{source.file}:{key_node.start_mark.line + 1}:{key_node.start_mark.column + 1}: "
                    f"{format_key_path(path)}: keys must be scalars"
                )
            if key in result:
                line = key_node.start_mark.line + 1
                first_line, _ = source.positions[(*path, key)]
                raise ManifestError(
                    f"{source.file}:{line}:{key_node.start_mark.column + 1}: "
                    f"{format_key_path((*path, key))}: duplicate key (first defined on line {first_line})"
                )
            result[key] = _construct(loader, value_node, (*path, key), source, environ)
            # An error about a key points at the key, not at its (possibly nested) value.
            source.positions[(*path, key)] = (
                key_node.start_mark.line + 1,
                key_node.start_mark.column + 1,
            )
        return result
    if isinstance(node, yaml.SequenceNode):
        return [
            _construct(loader, item, (*path, index), source, environ)
            for index, item in enumerate(node.value)
        ]
    value = loader.construct_object(node, deep=True)
    if isinstance(value, str):
        return interpolate(value, environ, source.where(path), path)
    return value


def interpolate(value: str, environ: dict[str, str], where: str, path: KeyPath) -> str:
    """Replace ``${VAR}`` / ``${VAR:-default}``; an unset variable without a default is an error."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(2)
        found = environ.get(name)
        if found:
            return found
        if default is not None:
            return default
        raise ManifestError(
            f"{where}: {format_key_path(path)}: environment variable {name} is not set "
            f"(write ${{{name}:-default}} to give a default)"
        )

    return _VARIABLE.sub(replace, value)
