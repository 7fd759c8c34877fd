"""``python -m edgebuild init [DIR]``: the files a new project starts from.

- ``dodo.py``, the thin doit entry point (the commands themselves come with the
  installed package, through its entry points);
- ``artifacts.yaml``, a commented manifest with one artifact of each built-in kind
  (with ``--plugins``: of each installed kind) that has a starter, each on a
  generated tiny checkpoint (each kind's ``starter`` hook), whose first line points
  editors at
- ``edgebuild.schema.json``, the manifest's JSON Schema (plugin kinds by name only,
  unless ``--plugins``: init imports no plugin it was not asked to, so a plugin that
  imports slowly or not at all costs it nothing);
- the sample input files the starter entries calibrate and verify with (each
  starter's ``samples``: for the built-in kinds, ``data/calibration/*.png`` and
  ``data/held_out/*.png``);
- ``.gitignore`` lines for ``build/`` and ``cache/``, appended to an existing one;
- with ``--ci github`` or ``--ci script``, the CI files for the repository
  (``ci_template.py``): ``ci/requirements.txt`` names what a runner installs for the
  kinds the manifest uses (the starter's, or those of an ``artifacts.yaml`` kept), each
  ``--requirement`` replacing what this installation would say of its package.

Nothing that exists is overwritten: an existing file is kept as it is and named
in the summary, with what would have been written. Everything is checked before
anything is written -- the directory, each path (a directory or a dangling symlink
where a file goes, a file where a folder goes, a symbolic link on the way to a file it
writes), the ``.gitignore`` (a regular UTF-8 file, not a link) -- so a refusal is one
line and leaves the directory as it was; a write that fails midway (a full disk)
removes what this run wrote. An existing file kept as it is may be a link: nothing is
written through it.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edgebuild.core.files import UnreadableFile, describe_entry, link_on_the_way, read_text
from edgebuild.errors import InitError

SCHEMA_FILE = "edgebuild.schema.json"
MANIFEST_FILE = "artifacts.yaml"
DODO_FILE = "dodo.py"
GITIGNORE_FILE = ".gitignore"
IGNORED = ("/build/", "/cache/")
GITIGNORE_BYTES = 1 << 20

# The repository's own dodo.py is this text (a test holds them equal).
DODO = '''"""doit entry point: every task comes from the manifest (``artifacts.yaml``, or
the file named by ``EDGEBUILD_MANIFEST``). Nothing else lives here."""

from edgebuild.tasks import artifact_tasks, doit_config, load_or_exit

PROJECT = load_or_exit()
DOIT_CONFIG = doit_config(PROJECT)


def task_artifacts():
    yield from artifact_tasks(PROJECT)
'''


@dataclass
class InitResult:
    directory: Path
    written: list[str] = field(default_factory=list)
    # Relative path -> what would have been written there.
    kept: dict[str, str] = field(default_factory=dict)
    appended: list[str] = field(default_factory=list)
    # Installed plugin kinds whose starters were not written (not asked for: no --plugins).
    plugins_left_out: list[str] = field(default_factory=list)
    # Plugins asked for that did not load, one line each.
    plugin_errors: list[str] = field(default_factory=list)


def _starters(plugins: bool = False, on_error: Callable[[Any], None] | None = None) -> list[tuple[str, Any]]:
    """``(kind name, starter)`` of every built-in kind (with ``plugins``: every installed
    kind) with a starter, each kind after the kinds whose artifacts its ``source:`` takes
    (what they produce, what it consumes): the starter manifest reads top down. A plugin
    that does not load goes to ``on_error``."""
    from edgebuild.core.registry import all_kinds, builtin_names

    names = None if plugins else builtin_names()
    loaded = all_kinds(on_error=on_error or (lambda error: None), names=names)
    kinds = {kind.name: kind for kind in loaded if kind.starter is not None}
    ordered: list[str] = []
    placing: set[str] = set()

    def place(name: str) -> None:
        if name in ordered or name in placing or name not in kinds:
            return
        placing.add(name)
        for source in sorted(kinds):
            if source != name and kinds[name].takes_source_of(kinds[source]):
                place(source)
        ordered.append(name)

    for name in sorted(kinds):
        place(name)
    return [(name, kinds[name].starter) for name in ordered]


def starter_manifest(plugins: bool = False, starters: list[tuple[str, Any]] | None = None) -> str:
    """The starter ``artifacts.yaml``: one artifact of every built-in kind (with ``plugins``:
    every installed kind) that has a starter (``starters``: those, found already)."""
    starters = _starters(plugins) if starters is None else starters
    checkpoints: dict[str, str] = {}
    for _, starter in starters:
        checkpoints.update(starter.checkpoints)
    lines = [
        f"# yaml-language-server: $schema=./{SCHEMA_FILE}",
        "# The artifacts this project builds. `doit list` lists them; `doit verify` builds",
        "# what is stale and verifies every one. After upgrading edgebuild, refresh the",
        f"# schema above with `python -m edgebuild schema > {SCHEMA_FILE}`.",
        "version: 1",
        "",
        "# Each checkpoint is a directory; while its variable is unset, a tiny generated",
        "# checkpoint of the same architecture stands in, so everything runs at once.",
        "# Instead of path, `hf: ORG/NAME` (with `revision: COMMIT`, default main) reads a",
        "# Hugging Face repository from the local cache (`hf download ORG/NAME` first).",
        "checkpoints:",
    ]
    for name, fixture in checkpoints.items():
        variable = f"{name.upper()}_CHECKPOINT"
        lines += [
            f"  {name}:",
            f"    path: ${{{variable}:-}}   # e.g. {variable}=/models/... doit verify",
            f"    fixture: {fixture}",
        ]
    lines += ["", "artifacts:"]
    for _, starter in starters:
        lines += [starter.text(), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def init_project(directory: Path, ci: str | None = None, plugins: bool = False,
                 requirements: list[str] | tuple[str, ...] = (), refresh_requirements: bool = False) -> InitResult:
    """Write the starter files into ``directory`` (created if missing), with the CI files
    of ``ci`` (``github``, ``script`` or ``None``); keep every file that exists. With
    ``plugins``, the installed plugin kinds' starters and parameters too (each imported;
    one that does not load is left out and named in ``plugin_errors``). ``requirements``:
    where a CI runner installs packages from, instead of what this installation says
    (``ci/requirements.txt``); ``refresh_requirements``: write ``ci/requirements.txt``
    again from the manifest as it is now, where it exists. :class:`InitError` before
    anything is written when a path is in the way, or a package cannot be installed on a
    runner."""
    from edgebuild.cli.ci_template import CI_CHOICES, REQUIREMENTS_FILE, ci_files, requirements_text
    from edgebuild.core.manifest import manifest_json_schema
    from edgebuild.core.registry import plugin_names

    if ci is not None and ci not in CI_CHOICES:
        raise InitError(f"--ci: expected one of {', '.join(CI_CHOICES)}, found {ci!r}")
    if requirements and ci is None:
        raise InitError("--requirement: says what CI installs; give it with --ci github or --ci script")
    if refresh_requirements and ci is None:
        raise InitError("--refresh-requirements: writes ci/requirements.txt again; give it with --ci github or --ci script")
    _check_directory(directory)
    result = InitResult(directory)
    if not plugins:
        result.plugins_left_out = plugin_names()

    def plugin_error(error: Any) -> None:
        if str(error) not in result.plugin_errors:
            result.plugin_errors.append(str(error))

    schema = json.dumps(manifest_json_schema(on_error=plugin_error, plugins=plugins), indent=2) + "\n"
    starters = _starters(plugins, plugin_error)
    manifest = starter_manifest(plugins, starters)
    files: dict[str, tuple[str, Callable[[], bytes]]] = {
        DODO_FILE: ("the doit entry point", lambda: DODO.encode()),
        MANIFEST_FILE: ("a starter manifest, one artifact of each kind", lambda: manifest.encode()),
        SCHEMA_FILE: ("the manifest's JSON Schema", lambda: schema.encode()),
    }
    for _, starter in starters:
        for relative, content in starter.samples.items():
            files[relative] = ("a generated sample input", content)
    for relative, (what, text) in (ci_files(ci) if ci else {}).items():
        files[relative] = (what, lambda text=text: text.encode())
    planned = {}
    for relative, (what, content) in files.items():
        if _existing_file(directory, relative):
            result.kept[relative] = what
        else:
            planned[relative] = content
    if refresh_requirements and REQUIREMENTS_FILE in result.kept:
        # Written again from the manifest as it is now (the other CI files are kept).
        del result.kept[REQUIREMENTS_FILE]
        (directory / REQUIREMENTS_FILE).unlink()
        planned[REQUIREMENTS_FILE] = files[REQUIREMENTS_FILE][1]
    if REQUIREMENTS_FILE in planned:
        # Derived now: a package a runner cannot install refuses init before anything is written.
        kinds, extras = _manifest_needs(directory, starters)
        text = requirements_text(kinds, requirements, extras)
        planned[REQUIREMENTS_FILE] = lambda: text.encode()
    gitignore = _gitignore_plan(directory)
    written: list[Path] = []
    made: list[Path] = []
    current = directory
    try:
        if not directory.exists():
            directory.mkdir(parents=True)
            made.append(directory)
        for relative, content in planned.items():
            path = current = directory / relative
            for folder in reversed([*path.relative_to(directory).parents][:-1]):
                if not (directory / folder).is_dir():
                    (directory / folder).mkdir()
                    made.append(directory / folder)
            if _create(path, content()):
                written.append(path)
                result.written.append(relative)
                if relative.endswith(".sh"):
                    path.chmod(0o755)
            else:
                result.kept[relative] = files[relative][0]
        if gitignore is not None:
            target, existing, missing = gitignore
            current = target
            _append_ignores(target, existing, missing)
            if existing is None:
                written.append(target)
                result.written.append(GITIGNORE_FILE)
            else:
                result.appended.extend(missing)
    except OSError as error:
        for path in reversed(written):
            path.unlink(missing_ok=True)
        for folder in reversed(made):
            try:
                folder.rmdir()
            except OSError:
                pass
        where = current if error.filename is None or ".init-" in str(error.filename) else error.filename
        raise InitError(f"{where}: cannot write the project's files: {error.strerror or error}; nothing was kept of this run") from None
    return result


def _manifest_needs(directory: Path, starters: list[tuple[str, Any]]) -> tuple[list[str], list[str]]:
    """The kinds the project's manifest uses and the extras its verify settings need
    (``ci_template.manifest_extras``): an ``artifacts.yaml`` init keeps, or else the
    starter's (the kinds whose starter entry is written uncommented)."""
    from edgebuild.cli.ci_template import manifest_extras
    from edgebuild.core.manifest import load_manifest
    from edgebuild.errors import EdgebuildError

    path = directory / MANIFEST_FILE
    if path.is_file():
        try:
            manifest = load_manifest(path, environ={})
            return sorted({params.kind for params in manifest.artifacts.values()}), sorted(manifest_extras(manifest))
        except EdgebuildError:
            pass  # a manifest being written: what the starter would use is the best guess
    return [name for name, starter in starters if starter.available()], []


def _check_directory(directory: Path) -> None:
    """``directory`` is a directory, or nothing that ``mkdir -p`` could not make."""
    for path in [directory, *directory.parents]:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode) and not path.exists():
            raise InitError(f"{path}: a symlink to nothing; expected a directory to lay the project out in (or nothing)")
        if not path.is_dir():
            raise InitError(f"{path}: {_what(path)}; expected a directory to lay the project out in (or nothing)")
        if path == directory and not os.access(path, os.W_OK | os.X_OK):
            raise InitError(f"{path}: not writable; expected a directory init may write in")
        return


def _existing_file(directory: Path, relative: str) -> bool:
    """Whether ``relative`` is there already as a file to keep; :class:`InitError` when
    something else is in its way (a directory, a dangling symlink, a file where a folder
    of its path goes)."""
    path = directory / relative
    _refuse_links(directory, Path(relative).parent, f"it writes {relative} there")
    for folder in reversed([*Path(relative).parents][:-1]):
        above = directory / folder
        if (above.exists() or above.is_symlink()) and not above.is_dir():
            raise InitError(f"{above}: {_what(above)}; expected a directory to hold {relative}")
    if path.is_symlink() and not path.exists():
        raise InitError(f"{path}: a symlink to nothing; expected a file to keep, or nothing (init writes {relative})")
    if not path.exists():
        return False
    if not path.is_file():
        raise InitError(f"{path}: {_what(path)}; expected a file to keep, or nothing (init writes {relative})")
    return True


def _refuse_links(directory: Path, relative: Path, doing: str) -> None:
    """:class:`InitError` for a symbolic link on the way to ``directory/relative``: init
    writes real files and folders inside the project, never through a link (the rule of
    ``edgebuild/core/files.py``)."""
    link = link_on_the_way(directory, relative)
    if link is not None:
        raise InitError(f"{link}: {describe_entry(link, os.lstat(link).st_mode)}; init writes inside the project and "
                        f"never through a link ({doing}): remove the link, or init another directory")


def _what(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return "a symlink to nothing"
    if path.is_dir():
        return "a directory"
    if path.is_file():
        return "a file"
    return "not a regular file"


def _gitignore_plan(directory: Path) -> tuple[Path, str | None, list[str]] | None:
    """Where the ignore lines go, what the file holds now (``None``: no file) and which
    lines are missing; ``None`` when none are. The file must be a regular UTF-8 file
    inside the project: a ``.gitignore`` linking elsewhere is never appended to."""
    path = directory / GITIGNORE_FILE
    if not (path.exists() or path.is_symlink()):
        return path, None, list(IGNORED)
    _refuse_links(directory, Path(GITIGNORE_FILE), f"it appends {', '.join(IGNORED)} to {GITIGNORE_FILE}")
    try:
        existing = read_text(path, GITIGNORE_BYTES)
    except UnreadableFile as error:
        raise InitError(f"{path}: {error}; expected a text {GITIGNORE_FILE} (init appends {', '.join(IGNORED)} to it)") from None
    except OSError as error:
        raise InitError(f"{path}: cannot read it: {error.strerror or error}") from None
    present = {line.strip() for line in existing.splitlines()}
    # Any usual spelling of the same rule counts as present.
    missing = [line for line in IGNORED if not present & {line, line.strip("/"), line.lstrip("/"), line.rstrip("/")}]
    return (path, existing, missing) if missing else None


def _append_ignores(path: Path, existing: str | None, missing: list[str]) -> None:
    """Add the lines that keep ``build/`` and ``cache/`` out of git."""
    text = ""
    if existing and not existing.endswith("\n"):
        text += "\n"
    if existing is None:
        text += "# edgebuild's outputs and caches (rebuilt from the manifest)\n"
    text += "".join(line + "\n" for line in missing)
    if existing is None:
        if not _create(path, text.encode()):
            raise InitError(f"{path}: appeared while init ran; run it again")
        return
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def _create(path: Path, content: bytes) -> bool:
    """Write ``path`` whole or not at all, never over a file that appeared meanwhile:
    the bytes go to a scratch file, linked into place (which fails if the name is
    taken). ``False`` when it was taken."""
    scratch = path.with_name(f".{path.name}.init-{os.getpid()}")
    try:
        with open(scratch, "xb") as handle:
            handle.write(content)
        try:
            os.link(scratch, path)
        except FileExistsError:
            return False
        except OSError:
            # A file system without hard links: exclusive creation, then the bytes.
            try:
                with open(path, "xb") as handle:
                    handle.write(content)
            except FileExistsError:
                return False
        return True
    finally:
        scratch.unlink(missing_ok=True)


def describe(result: InitResult, shown: str) -> str:
    """What ``init`` tells the user: what it wrote, what it kept, the next two commands."""
    lines = []
    if result.written:
        lines.append(f"wrote {', '.join(_grouped(result.written))} in {shown}")
    if result.appended:
        lines.append(f"added {', '.join(result.appended)} to {shown}/{GITIGNORE_FILE}")
    for relative, what in _grouped_kept(result.kept).items():
        lines.append(f"kept {relative}: it exists (init would have written {what})")
    if result.plugins_left_out:
        lines.append(f"plugin kinds installed, not loaded: {', '.join(result.plugins_left_out)} "
                     "(init --plugins writes their starters and parameters too)")
    prefix = "" if shown == "." else f"cd {shlex.quote(shown)} && "
    lines += [
        "next:",
        f"  {prefix}doit list      # the artifacts the manifest declares",
        "  doit verify" + " " * len(prefix) + "    # build and verify every one of them",
    ]
    return "\n".join(lines)


def _grouped(paths: list[str]) -> list[str]:
    """The sample inputs as one ``data/calibration/*.png``-style item per folder and suffix;
    any other file as it is."""
    items = _items(paths)
    return list(dict.fromkeys(items[path] for path in paths))


def _items(paths: list[str]) -> dict[str, str]:
    """Each path -> how it is shown: a sample input as its folder-and-suffix pattern, any
    other file (the CI files among them) by its name."""

    from edgebuild.cli.ci_template import ci_files

    named = set(ci_files("github"))

    def pattern(path: str) -> str:
        folder, _, name = path.rpartition("/")
        suffix = Path(name).suffix
        return f"{folder}/*{suffix}" if folder and suffix and path not in named else path

    return {path: pattern(path) for path in paths}


def _grouped_kept(kept: dict[str, str]) -> dict[str, str]:
    grouped: dict[str, str] = {}
    items = _items(list(kept))
    for path, what in kept.items():
        grouped.setdefault(items[path], what if items[path] == path else "generated sample inputs")
    return grouped
