"""The typed manifest: ``artifacts.yaml`` -> :class:`Manifest`.

Validation happens in full before any task runs, so a bad manifest never
touches an output. Every error names the file, line, key path, what was
expected and what was found, with a hint for a misspelt key.
"""

from __future__ import annotations

import difflib
import itertools
import os
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgebuild.core.config import Settings
from edgebuild.core.console import terminal_unsafe
from edgebuild.core.kind import ArtifactParams, PrintableText, Strict
from edgebuild.core.registry import all_kinds, builtin_names, get_kind, kind_names, plugin_names, producers
from edgebuild.core.thresholds import coverage_context
from edgebuild.core.yamlsource import KeyPath, SourceMap, format_key_path, load_yaml
from edgebuild.errors import ManifestError, PluginError
DEFAULT_MANIFEST = "artifacts.yaml"
MANIFEST_VERSION = 1

# Artifact names become doit task names and directory names under build/.
# Always fullmatch: ``$`` would also match before a final newline.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# A name is a directory under build/ and in the store's scratch names (a prefix and a
# suffix around it), inside file systems' 255-byte limit with room to spare.
MAX_NAME_LENGTH = 100
# A ``{placeholder}`` of a matrix name template: a matrix key, with no index,
# attribute, conversion or format spec for str.format to trip over.
_PLACEHOLDER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# doit refuses tasks named like its commands; edgebuild adds its own.
RESERVED_NAMES = frozenset(
    {"build", "verify", "status", "publish", "gc", "cache", "report", "list", "info", "clean", "forget",
     "ignore", "dumpdb", "strace", "tabcompletion", "reset-dep", "help", "run", "auto"}
)
# A plain scalar that is exactly one ``${NAME}`` / ``${NAME:-default}`` (see yamlsource):
# typed after substitution, so the schema lets it stand for any scalar.
INTERPOLATION_PATTERN = r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:-((?!\$\{)[^}])*)?\}$"


class CheckpointSpec(Strict):
    """A checkpoint: a Hugging Face repo in the local cache, a directory, or a built-in
    fixture that edgebuild generates.

    ``hf`` and ``path`` are alternatives; when both are empty the fixture is the
    fallback: the default manifest says ``path: ${QWEN3_5_CHECKPOINT:-}`` so a
    user points it at a real checkpoint without editing the file.
    """

    hf: str | None = Field(
        default=None,
        description="Hugging Face repo id (``org/name``), read offline from the local Hugging Face cache.",
    )
    revision: str | None = Field(
        default=None,
        description=(
            "With ``hf``: a 40-hex commit, or a branch or tag resolved through the cache's refs "
            "(default ``main``); the commit it resolves to is recorded."
        ),
    )

    # The validator below, for the JSON Schema.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["hf"], "properties": {"hf": {"type": "string", "minLength": 1}}},
                {"required": ["path"], "properties": {"path": {"type": "string", "minLength": 1}}},
                {"required": ["fixture"], "properties": {"fixture": {"type": "string", "minLength": 1}}},
            ],
            "if": {"required": ["fixture_config"], "properties": {"fixture_config": {"minProperties": 1}}},
            "then": {"required": ["fixture"], "properties": {"fixture": {"type": "string", "minLength": 1}}},
        }
    )

    path: str | None = Field(default=None, description="Checkpoint directory (``${VAR:-default}`` allowed).")
    fixture: str | None = Field(default=None, description="Name of a generated tiny checkpoint (used when path and hf are empty).")
    fixture_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the fixture's config (e.g. ``vision_config: {depth: 3}``).",
    )
    description: PrintableText = Field(default="", description="A note for readers of the manifest; it changes nothing.")

    @field_validator("hf")
    @classmethod
    def _a_repo_id(cls, value: str | None) -> str | None:
        from edgebuild.core.hub import repo_id_problem

        problem = repo_id_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("revision")
    @classmethod
    def _a_revision(cls, value: str | None) -> str | None:
        from edgebuild.core.hub import revision_problem

        problem = revision_problem(value) if value else None
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _a_source(self) -> "CheckpointSpec":
        if self.path and self.hf:
            raise ValueError("give one of 'path' and 'hf', not both")
        if not self.path and not self.hf and not self.fixture:
            raise ValueError("give a non-empty 'hf' or 'path', or a 'fixture'")
        if self.fixture_config and not self.fixture:
            raise ValueError("'fixture_config' only applies to a 'fixture' checkpoint")
        if self.revision and not self.hf:
            raise ValueError("'revision' only applies to an 'hf' checkpoint")
        return self

    @property
    def uses_fixture(self) -> bool:
        return not self.path and not self.hf

    @property
    def hf_revision(self) -> str:
        """The revision to resolve: as written, ``main`` when empty."""
        from edgebuild.core.hub import DEFAULT_REVISION

        return self.revision or DEFAULT_REVISION


class ManifestDocument(Strict):
    """The top level of ``artifacts.yaml``. Artifacts are validated per kind afterwards."""

    version: Literal[1] = Field(default=MANIFEST_VERSION, description="The manifest format; 1, the only one so far.")
    checkpoints: dict[str, CheckpointSpec] = Field(
        default_factory=dict, description="Checkpoints by the name artifacts use for them (their checkpoint: key)."
    )
    artifacts: dict[str, dict[str, Any]] = Field(
        description="Artifacts by name: each a kind and its parameters (see the kinds' reference), or a matrix of them."
    )
    defaults: list[str] | None = Field(
        default=None, description="Artifacts that a bare ``doit`` builds (all when omitted)."
    )
    remote_cache: str | None = Field(
        default=None,
        description=(
            "A shared cache of verified builds: a directory (relative to this file) or an fsspec URL "
            "(``s3://bucket/prefix``). ``EDGEBUILD_REMOTE_CACHE`` overrides it; ``off`` disables it."
        ),
    )


@dataclass(frozen=True)
class Manifest:
    path: Path
    checkpoints: dict[str, CheckpointSpec]
    artifacts: dict[str, ArtifactParams]
    defaults: list[str]
    source: SourceMap
    # Artifact name -> the manifest entry (or matrix template) it came from.
    origins: dict[str, str]
    # The top-level ``remote_cache`` as written (after ``${VAR}`` interpolation).
    remote_cache: str | None = None

    @property
    def root(self) -> Path:
        """Relative paths in the manifest are relative to its directory."""
        return self.path.parent

    def where(self, name: str, *keys: str) -> str:
        """``file:line:column: artifacts -> name -> key`` for messages about an artifact."""
        location = self.source.where(("artifacts", self.origins[name], *keys))
        return f"{location}: " + " -> ".join(("artifacts", name, *keys))

    def dependencies(self, name: str) -> list[str]:
        return self.artifacts[name].source_artifacts()

    def order(self, names: list[str] | None = None) -> list[str]:
        """``names`` and everything they depend on, dependencies first."""
        ordered: list[str] = []
        seen: set[str] = set()

        def visit(name: str) -> None:
            if name in seen:
                return
            seen.add(name)
            for dependency in self.dependencies(name):
                visit(dependency)
            ordered.append(name)

        for name in names if names is not None else list(self.artifacts):
            visit(name)
        return ordered


def manifest_path(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or Settings.from_environ().manifest or DEFAULT_MANIFEST)


def load_manifest(
    path: str | os.PathLike[str] | None = None, environ: dict[str, str] | None = None
) -> Manifest:
    path = manifest_path(path)
    raw, source = load_yaml(path, environ)
    if not isinstance(raw, dict):
        raise ManifestError(f"{source.where(())}: (top level): expected a mapping, found {_type_name(raw)}")
    try:
        document = ManifestDocument.model_validate(raw)
    except ValidationError as error:
        raise _manifest_error(error, source, (), ManifestDocument) from None

    artifacts: dict[str, ArtifactParams] = {}
    origin: dict[str, str] = {}
    errors: list[str] = []
    for alias in document.checkpoints:
        problem = terminal_unsafe(alias)
        if problem:
            errors.append(f"{source.where(('checkpoints', alias))}: checkpoints -> {alias!r}: expected a checkpoint name "
                          f"a terminal shows as written, found {problem}")
    folded: dict[str, str] = {}
    for template, entry in document.artifacts.items():
        first_failure: tuple[str, str] | None = None
        repeats = 0
        try:
            expanded = expand_matrix(template, entry, source)
        except ManifestError as error:
            errors.append(str(error))
            continue
        where = source.where(("artifacts", template))
        for name, values in expanded:
            if name in artifacts:
                first_line, _ = source.positions[("artifacts", origin[name])]
                errors.append(
                    f"{where}: artifacts -> {template}: duplicate artifact name {name!r} "
                    f"(first declared on line {first_line})"
                )
                continue
            problem = _name_problem(name)
            if problem:
                errors.append(f"{where}: {format_key_path(('artifacts', template))}: {problem}")
                continue
            twin = folded.setdefault(name.casefold(), name)
            if twin != name:
                first_line, _ = source.positions[("artifacts", origin[twin])]
                errors.append(
                    f"{where}: artifacts -> {template}: artifact name {name!r} differs from {twin!r} (line {first_line}) "
                    "only in case; expected names that differ otherwise (build/ would hold both in one directory "
                    "on macOS and Windows)"
                )
                continue
            try:
                artifacts[name] = _validate_artifact(name, template, values, source)
                origin[name] = template
            except ManifestError as error:
                message = str(error)
                if first_failure is not None and message.replace(f"({name})", f"({first_failure[0]})") == first_failure[1]:
                    repeats += 1  # the same fault in every member of a matrix: said once
                    continue
                if first_failure is None:
                    first_failure = (name, message)
                errors.append(message)
        if repeats:
            errors.append(f"{source.where(('artifacts', template))}: artifacts -> {template}: the same for "
                          f"{repeats} more of its matrix")
    if not errors:
        _add_implied_sources(artifacts, origin, source, errors)
    if errors:
        raise ManifestError("\n".join(errors))

    manifest = Manifest(
        # Absolute: the manifest's directory is the project's root whatever the cwd
        # becomes (messages keep the path as given, through ``source``).
        path=Path(os.path.abspath(path)),
        checkpoints=dict(document.checkpoints),
        artifacts=artifacts,
        defaults=list(document.defaults) if document.defaults is not None else list(artifacts),
        source=source,
        origins=origin,
        remote_cache=document.remote_cache or None,
    )
    _check_references(manifest, origin)
    return manifest


def expand_matrix(template: str, entry: dict[str, Any], source: SourceMap) -> list[tuple[str, dict[str, Any]]]:
    """``{name_template: {..., matrix: {key: [values]}}}`` -> one entry per combination.

    The name must use every matrix key (``tower_{image_size}_{dtype}``), so
    that every combination gets its own name.
    """
    path: KeyPath = ("artifacts", template)
    if not isinstance(entry, dict):
        raise ManifestError(f"{source.where(path)}: {format_key_path(path)}: expected a mapping, found {_type_name(entry)}")
    placeholders = _placeholders(template, source, path)
    if "matrix" not in entry:
        if placeholders:
            raise ManifestError(
                f"{source.where(path)}: {format_key_path(path)}: the name uses "
                f"{{{placeholders[0]}}} but the entry has no 'matrix'"
            )
        return [(template, entry)]
    matrix = entry["matrix"]
    matrix_path = (*path, "matrix")
    if not isinstance(matrix, dict) or not matrix:
        raise ManifestError(
            f"{source.where(matrix_path)}: {format_key_path(matrix_path)}: expected a mapping "
            f"of key -> list of values, found {_type_name(matrix)}"
        )
    for key, values in matrix.items():
        if not isinstance(values, list) or not values:
            raise ManifestError(
                f"{source.where((*matrix_path, key))}: {format_key_path((*matrix_path, key))}: "
                f"expected a non-empty list of values, found {_type_name(values)}"
            )
        if key == "kind":
            raise ManifestError(
                f"{source.where((*matrix_path, key))}: {format_key_path((*matrix_path, key))}: "
                "the kind cannot vary in a matrix; write one entry per kind"
            )
        if key in entry:
            raise ManifestError(
                f"{source.where((*path, key))}: {format_key_path((*path, key))}: "
                f"set both directly and in 'matrix'; keep one"
            )
    missing = [key for key in matrix if key not in placeholders]
    if missing:
        raise ManifestError(
            f"{source.where(path)}: {format_key_path(path)}: the name must contain "
            + ", ".join(f"{{{key}}}" for key in missing)
            + " so that every matrix combination gets its own name"
        )
    unknown = [key for key in placeholders if key not in matrix]
    if unknown:
        hint = _did_you_mean(unknown[0], list(matrix))
        raise ManifestError(
            f"{source.where(path)}: {format_key_path(path)}: the name uses {{{unknown[0]}}}, "
            f"which is not a matrix key{hint}"
        )
    base = {key: value for key, value in entry.items() if key != "matrix"}
    keys = list(matrix)
    expanded = []
    for combination in itertools.product(*(matrix[key] for key in keys)):
        values = dict(zip(keys, combination))
        name = template.format_map({key: _name_part(value) for key, value in values.items()})
        expanded.append((name, {**base, **values}))
    return expanded


def manifest_json_schema(on_error: Any = None, plugins: bool = True) -> dict[str, Any]:
    """JSON Schema of the manifest, for editors: it accepts what :func:`load_manifest`
    accepts, as far as a schema can say it.

    Beyond the models' own schemas: an artifact entry is checked against its kind's
    parameters (chosen by ``kind``); a matrix entry may give any parameter as a list
    of values under ``matrix`` instead (every required one in one place or the
    other, never both), and only an entry whose name has a ``{placeholder}`` has a
    matrix; a ``${VAR}`` may stand for any scalar. What depends on more than one
    document -- undeclared checkpoints and sources, a name that misses a matrix
    key, an image size the checkpoint cannot take -- is the loader's alone.

    Every installed kind is in it, plugins included; a plugin that does not load is
    passed to ``on_error`` (a :class:`~edgebuild.errors.PluginError`; default: raised).
    Without ``plugins`` no plugin is imported: their kinds are in it by name only, with
    parameters unchecked (``init`` writes that one; ``schema`` the whole).
    """
    kinds = all_kinds(on_error, None if plugins else builtin_names())
    unloaded = [] if plugins else plugin_names()
    definitions: dict[str, Any] = {}
    document = ManifestDocument.model_json_schema(ref_template="#/$defs/{model}")
    definitions.update(document.pop("$defs", {}))
    dispatch = []
    for kind in kinds:
        name = kind.name
        model = kind.Params
        schema = model.model_json_schema(ref_template="#/$defs/{model}")
        definitions.update(schema.pop("$defs", {}))
        definitions[model.__name__] = schema
        definitions[f"{model.__name__}Matrix"] = _matrix_schema(schema)
        dispatch.append(
            {
                "if": {"required": ["kind"], "properties": {"kind": {"const": name}}},
                "then": {
                    "if": {"required": ["matrix"]},
                    "then": {"$ref": f"#/$defs/{model.__name__}Matrix"},
                    "else": {"$ref": f"#/$defs/{model.__name__}"},
                    # The coverage targets of this kind's formats, of those every kind's.
                    "allOf": [_kind_coverage_targets(kind)],
                },
            }
        )
    coverage_targets_schema(definitions, kinds)
    definitions = {key: _interpolation_allowed(value) for key, value in definitions.items()}
    document["properties"] = {key: _interpolation_allowed(value) for key, value in document["properties"].items()}
    definitions["Interpolation"] = {
        "type": "string",
        "pattern": INTERPOLATION_PATTERN,
        "description": "${VAR} or ${VAR:-default}: typed as if its value had been written here.",
    }
    definitions["Artifact"] = {
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"enum": [kind.name for kind in kinds] + unloaded}},
        "allOf": dispatch,
    }
    artifact = {"$ref": "#/$defs/Artifact"}
    document["properties"]["artifacts"] = {
        "type": "object",
        "description": "Artifact name (or a name template using {matrix_key}) -> artifact.",
        "propertyNames": {"not": {"enum": sorted(RESERVED_NAMES)}},
        # A name with a {placeholder} is a matrix entry; one without is a single artifact.
        "patternProperties": {
            r"\{": {"allOf": [artifact, {"required": ["matrix"]}]},
            r"^[^{]*$": {"allOf": [artifact, {"not": {"required": ["matrix"]}}]},
        },
    }
    document["$defs"] = definitions
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "edgebuild manifest"
    return document


def _kind_coverage_targets(kind: Any) -> dict[str, Any]:
    """What ``verify.coverage`` of an artifact of ``kind`` (or of each entry of a matrix's
    ``verify``) may name: the targets of its own formats' certificates, as the loader holds it."""
    targets = list(kind.certificates())
    coverage = {
        "properties": {"targets": {"anyOf": [
            {"type": "array", "items": {"anyOf": [{"enum": targets}, {"$ref": "#/$defs/Interpolation"}]}},
            {"type": "null"}, {"$ref": "#/$defs/Interpolation"}]}},
        "propertyNames": {"enum": ["targets", *targets]},
    }
    verify = {"properties": {"coverage": coverage}}
    return {"properties": {"verify": verify, "matrix": {"properties": {"verify": {"items": verify}}}}}


def coverage_targets_schema(definitions: dict[str, Any], kinds: list[Any]) -> None:
    """``verify.coverage`` names the targets of the kinds' certificates: those the loaded
    kinds declare, each a key of its own with its summary (each artifact's own kind's
    narrow them further: :func:`_kind_coverage_targets`)."""
    settings = definitions.get("CoverageSettings")
    if settings is None:
        return
    targets = {target.name: target for kind in kinds for target in kind.certificates().values()}
    gate = settings.pop("additionalProperties", {"$ref": "#/$defs/CoverageGate"})
    settings["properties"]["targets"]["anyOf"][0]["items"] = {"enum": list(targets)}
    for name, target in targets.items():
        settings["properties"][name] = {
            "anyOf": [gate, {"type": "null"}], "default": None,
            "description": f"Gates on {target.summary}; never_on_cpu names {target.vocabulary}"
                           + (" (checked when the manifest is loaded)." if target.op_types else " (not checked)."),
        }
    settings["additionalProperties"] = False


_SCALAR_TYPES = {"integer", "number", "boolean", "null"}


def _matrix_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema of a matrix entry of a kind whose parameters' schema is ``schema``."""
    properties = dict(schema["properties"])
    varying = {key: value for key, value in properties.items() if key not in ("kind", "matrix")}
    required = [key for key in schema.get("required", []) if key != "kind"]
    properties["matrix"] = {
        "type": "object",
        "description": "key -> list of values; one artifact per combination.",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {key: {"type": "array", "minItems": 1, "items": value} for key, value in varying.items()},
    }
    in_matrix = lambda key: {"required": ["matrix"], "properties": {"matrix": {"required": [key]}}}  # noqa: E731
    return {
        **{key: value for key, value in schema.items() if key not in ("properties", "required")},
        "properties": properties,
        "required": ["kind", "matrix"],
        "allOf": [
            *({"anyOf": [{"required": [key]}, in_matrix(key)]} for key in required),
            *({"not": {"allOf": [{"required": [key]}, in_matrix(key)]}} for key in varying),
        ],
    }


def _interpolation_allowed(schema: Any) -> Any:
    """``schema`` with a ``${VAR}`` string allowed wherever it takes a scalar other than
    a free string (a number, a boolean, null, or one of fixed values)."""
    if not isinstance(schema, dict):
        return schema
    result = {}
    for key, value in schema.items():
        if key in ("properties", "patternProperties", "$defs"):
            result[key] = {name: _interpolation_allowed(item) for name, item in value.items()}
        elif key in ("items", "additionalProperties", "not", "if", "then", "else"):
            result[key] = _interpolation_allowed(value)
        elif key in ("prefixItems", "allOf"):
            result[key] = [_interpolation_allowed(item) for item in value]
        elif key in ("anyOf", "oneOf"):
            branches = [_interpolation_allowed(item) for item in value]
            result[key] = [_without_interpolation(branch) for branch in branches]
            if any(_is_interpolated(branch) for branch in branches) and not any(
                branch == _INTERPOLATION_REF for branch in result[key]
            ):
                result[key].append(_INTERPOLATION_REF)
        else:
            result[key] = value
    if _takes_fixed_scalar(result):
        # Annotations stay outside, where an editor looks for them.
        outside = {key: result.pop(key) for key in _ANNOTATIONS if key in result}
        return {"anyOf": [result, _INTERPOLATION_REF], **outside}
    return result


_INTERPOLATION_REF = {"$ref": "#/$defs/Interpolation"}
_ANNOTATIONS = ("title", "description", "default", "examples")


def _takes_fixed_scalar(schema: dict[str, Any]) -> bool:
    if any(key in schema for key in ("properties", "items", "anyOf", "oneOf", "allOf", "$ref", "prefixItems")):
        return False
    kind = schema.get("type")
    return kind in _SCALAR_TYPES or "enum" in schema or "const" in schema


def _is_interpolated(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and set(schema) <= {"anyOf", *_ANNOTATIONS}
        and _INTERPOLATION_REF in schema.get("anyOf", [])
    )


def _without_interpolation(schema: Any) -> Any:
    """A branch of an ``anyOf`` without its own ``${VAR}`` alternative (the ``anyOf``
    gets one for all its branches)."""
    if _is_interpolated(schema) and len(schema["anyOf"]) == 2:
        inner = schema["anyOf"][0]
        return {**inner, **{key: value for key, value in schema.items() if key != "anyOf"}}
    return schema


# --- helpers -----------------------------------------------------------------


def _add_implied_sources(artifacts: dict[str, ArtifactParams], origin: dict[str, str], source: SourceMap,
                         errors: list[str]) -> None:
    """Add the artifacts that others imply (``ArtifactParams.implied_source``: a target
    describing its model inline implies its model's program export) as ``<name>.<kind>``,
    one for all artifacts that imply the same values, and make each its implier's source."""
    from edgebuild.core.hashing import canonical_json

    added: dict[str, str] = {}
    for name in list(artifacts):
        params = artifacts[name]
        values = params.implied_source()
        if values is None or params.source_artifacts():
            continue
        key = canonical_json(values)
        implied = added.get(key)
        if implied is None:
            implied = f"{name}.{values['kind']}"
            where = source.where(("artifacts", origin[name]))
            problem = _name_problem(implied)
            if implied in artifacts or problem:
                errors.append(f"{where}: artifacts -> {origin[name]}: the {values['kind']} it implies would be named "
                              f"{implied!r}, " + (problem or "and an artifact has that name: rename it, or give source:"))
                continue
            try:
                artifacts[implied] = _validate_artifact(implied, origin[name], values, source)
            except ManifestError as error:
                errors.append(str(error))
                continue
            origin[implied] = origin[name]
            added[key] = implied
        artifacts[name] = params.model_copy(update={"source": implied})


def _validate_artifact(name: str, template: str, values: dict[str, Any], source: SourceMap) -> ArtifactParams:
    path: KeyPath = ("artifacts", template)
    label = template if name == template else f"{template} ({name})"
    kind = values.get("kind")
    if kind is None:
        raise ManifestError(
            f"{source.where(path)}: artifacts -> {label}: missing required key 'kind' "
            f"(one of {', '.join(map(repr, kind_names()))})"
        )
    if kind not in kind_names():
        hint = _did_you_mean(str(kind), kind_names())
        raise ManifestError(
            f"{source.where((*path, 'kind'))}: artifacts -> {label} -> kind: unknown artifact kind "
            f"{kind!r}; expected one of {', '.join(map(repr, kind_names()))}{hint}"
        )
    try:
        loaded = get_kind(kind)
    except PluginError as error:
        # The plugin this artifact needs is broken; one that no artifact names is never loaded.
        raise ManifestError(f"{source.where((*path, 'kind'))}: artifacts -> {label} -> kind: {error}") from None
    model = loaded.Params
    try:
        return model.model_validate(values, context=coverage_context(loaded))
    except ValidationError as error:
        raise _manifest_error(error, source, path, model, label=("artifacts", label)) from None


def _check_references(manifest: Manifest, origin: dict[str, str]) -> None:
    errors = []
    source = manifest.source
    for name, params in manifest.artifacts.items():
        path = ("artifacts", origin[name])
        for checkpoint in params.checkpoint_names():
            if checkpoint not in manifest.checkpoints:
                hint = _did_you_mean(checkpoint, list(manifest.checkpoints))
                declared = ", ".join(map(repr, manifest.checkpoints)) or "none"
                errors.append(
                    f"{source.where((*path, 'checkpoint'))}: artifacts -> {name} -> checkpoint: "
                    f"undeclared checkpoint {checkpoint!r} (declared: {declared}){hint}"
                )
        for dependency in params.source_artifacts():
            if dependency not in manifest.artifacts:
                hint = _did_you_mean(dependency, list(manifest.artifacts))
                errors.append(
                    f"{source.where((*path, 'source'))}: artifacts -> {name} -> source: "
                    f"undeclared artifact {dependency!r}{hint}"
                )
                continue
            consumer = get_kind(params.kind)
            found = get_kind(manifest.artifacts[dependency].kind)
            if not consumer.takes_source_of(found):
                writes = " and ".join(form.summary for form in found.produces) or "nothing another kind reads"
                wanted = " or ".join(form.summary for form in consumer.consumes) or "no source"
                makers = producers(consumer)
                errors.append(
                    f"{source.where((*path, 'source'))}: artifacts -> {name} -> source: {dependency!r} is a "
                    f"{found.name} artifact, which writes {writes}; a {params.kind} artifact takes {wanted}"
                    + (f" (a source of kind {' or '.join(makers)})" if makers else "")
                )
        verify = getattr(params, "verify", None)
        if not params.source_artifacts() and "vs_float" in getattr(verify, "model_fields_set", ()):
            # Judged against nothing: a limit here would be dropped without a word.
            errors.append(
                f"{source.where((*path, 'verify', 'vs_float'))}: artifacts -> {name} -> verify -> vs_float: {name} is "
                "made from no source, so it is the float model of its own chain and nothing compares it with one; "
                "set vs_float on the artifacts made from it (a dataset gate judges a root on data)"
            )
    for default in manifest.defaults:
        if default not in manifest.artifacts:
            hint = _did_you_mean(default, list(manifest.artifacts))
            errors.append(f"{source.where(('defaults',))}: defaults: undeclared artifact {default!r}{hint}")
    if errors:
        raise ManifestError("\n".join(errors))
    cycle = _find_cycle(manifest)
    if cycle:
        raise ManifestError(
            f"{source.where(('artifacts', origin[cycle[0]]))}: artifacts: dependency cycle "
            + " -> ".join(cycle)
        )


def _find_cycle(manifest: Manifest) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for dependency in manifest.dependencies(name):
            if state.get(dependency) == 1:
                return stack[stack.index(dependency):] + [dependency]
            if dependency not in state:
                found = visit(dependency)
                if found:
                    return found
        stack.pop()
        state[name] = 2
        return None

    for name in manifest.artifacts:
        if name not in state:
            found = visit(name)
            if found:
                return found
    return None


def _manifest_error(
    error: ValidationError,
    source: SourceMap,
    base: KeyPath,
    model: type[BaseModel],
    label: KeyPath | None = None,
) -> ManifestError:
    lines = []
    for item in error.errors(include_url=False):
        location = tuple(item["loc"])
        # A discriminated or union field puts the chosen member's tag in loc; drop
        # entries that are not keys of the document.
        path = (*base, *location)
        shown = (*(label or base), *location)
        where = source.where(path)
        kind = item["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_keys(model, location[:-1])
            hint = _did_you_mean(str(location[-1]), allowed)
            message = f"unknown key {location[-1]!r}{hint}"
            if not hint and allowed:
                message += f" (allowed: {', '.join(allowed)})"
        elif kind == "missing":
            message = f"missing required key {location[-1]!r}" if location else "missing required key"
        elif kind == "value_error":
            message = _lower_first(item["msg"].removeprefix("Value error, "))
            if not isinstance(item.get("input"), (dict, list)):
                message += f"; found {_describe(item.get('input'))}"
        else:
            message = f"{_lower_first(item['msg'])}; found {_describe(item.get('input'))}"
        lines.append(f"{where}: {format_key_path(shown)}: {message}")
    return ManifestError("\n".join(lines))


def _allowed_keys(model: type[BaseModel], location: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at ``location``."""
    current: Any = model
    for part in location:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return []
        annotation = field.annotation
        nested = [
            candidate
            for candidate in (annotation, *getattr(annotation, "__args__", ()))
            if isinstance(candidate, type) and issubclass(candidate, BaseModel)
        ]
        current = nested[0] if nested else None
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [name for name in current.model_fields]
    return []


def _did_you_mean(found: str, candidates: list[str]) -> str:
    match = difflib.get_close_matches(found, candidates, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _placeholders(template: str, source: SourceMap, path: KeyPath) -> list[str]:
    try:
        fields = [
            (field, spec, conversion)
            for _, field, spec, conversion in string.Formatter().parse(template)
            if field is not None
        ]
    except ValueError as error:
        raise ManifestError(f"{source.where(path)}: {format_key_path(path)}: bad name template: {error}") from None
    for field, spec, conversion in fields:
        if not _PLACEHOLDER.fullmatch(field) or spec or conversion:
            written = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ManifestError(
                f"{source.where(path)}: {format_key_path(path)}: bad name template: found {written}; "
                "expected {key} placeholders naming matrix keys"
            )
    return [field for field, _, _ in fields]


def _name_part(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "x".join(str(item) for item in value)
    return str(value)


def _name_problem(name: str) -> str | None:
    if len(name) > MAX_NAME_LENGTH:
        return f"artifact name {name[:20]!r}... is {len(name)} characters long; expected at most {MAX_NAME_LENGTH}"
    if not _NAME.fullmatch(name):
        return (
            f"artifact name {name!r} must start with a letter or digit and contain only "
            "letters, digits, '_', '.' and '-'"
        )
    if name in RESERVED_NAMES:
        return f"artifact name {name!r} is reserved (it is a doit command)"
    return None


def _type_name(value: Any) -> str:
    return {
        dict: "a mapping", list: "a list", str: "a string", type(None): "nothing",
        bool: "a boolean", int: "an integer", float: "a number",
    }.get(type(value), type(value).__name__)


def _describe(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return _type_name(value)
    return repr(value)


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
