"""``python -m edgebuild init [DIR]``: the files a new project starts from.

- ``dodo.py``, the thin doit entry point (the commands themselves come with the
  installed package, through its entry points);
- ``artifacts.yaml``, a commented manifest with one artifact of each installed
  kind that has a starter, each on a generated tiny checkpoint (each kind's
  ``starter`` hook), whose first line points editors at
- ``edgebuild.schema.json``, the manifest's JSON Schema;
- the sample input files the starter entries calibrate and verify with (each
  starter's ``samples``: for the built-in kinds, ``data/calibration/*.png`` and
  ``data/held_out/*.png``);
- ``.gitignore`` lines for ``build/`` and ``cache/``, appended to an existing one;
- with ``--ci github`` or ``--ci script``, the CI files for the repository
  (``ci_template.py``).

Nothing that exists is overwritten: an existing file is kept as it is and named
in the summary, with what would have been written. Everything is checked before
anything is written -- the directory, each path (a directory or a dangling symlink
where a file goes, a file where a folder goes), the ``.gitignore`` (a regular UTF-8
file inside the project) -- so a refusal is one line and leaves the directory as it
was; a write that fails midway (a full disk) removes what this run wrote.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from edgebuild.core.files import UnreadableFile, read_text
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


def _starters() -> list[tuple[str, Any]]:
    """``(kind name, starter)`` of every installed kind with a starter, each kind after the
    kinds its ``source:`` takes: the starter manifest reads top down."""
    from edgebuild.core.registry import all_kinds

    kinds = {kind.name: kind for kind in all_kinds(on_error=lambda error: None) if kind.starter is not None}
    ordered: list[str] = []

    def place(name: str) -> None:
        if name in ordered or name not in kinds:
            return
        for source in kinds[name].source_kinds:
            place(source)
        ordered.append(name)

    for name in sorted(kinds):
        place(name)
    return [(name, kinds[name].starter) for name in ordered]


def starter_manifest() -> str:
    """The starter ``artifacts.yaml``: one artifact of every installed kind that has a starter."""
    starters = _starters()
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


def sample_files() -> dict[str, Any]:
    """Every sample input file the starters name: path under the project -> its bytes' maker."""
    files: dict[str, Any] = {}
    for _, starter in _starters():
        files.update(starter.samples)
    return files


def init_project(directory: Path, ci: str | None = None) -> InitResult:
    """Write the starter files into ``directory`` (created if missing), with the CI files
    of ``ci`` (``github``, ``script`` or ``None``); keep every file that exists.
    :class:`InitError` before anything is written when a path is in the way."""
    from edgebuild.cli.ci_template import CI_CHOICES, ci_files
    from edgebuild.core.manifest import manifest_json_schema

    if ci is not None and ci not in CI_CHOICES:
        raise InitError(f"--ci: expected one of {', '.join(CI_CHOICES)}, found {ci!r}")
    _check_directory(directory)
    files: dict[str, tuple[str, Callable[[], bytes]]] = {
        DODO_FILE: ("the doit entry point", lambda: DODO.encode()),
        MANIFEST_FILE: ("a starter manifest, one artifact of each kind", lambda: starter_manifest().encode()),
        SCHEMA_FILE: ("the manifest's JSON Schema", lambda: (json.dumps(manifest_json_schema(), indent=2) + "\n").encode()),
    }
    for relative, content in sample_files().items():
        files[relative] = ("a generated sample input", content)
    for relative, (what, text) in (ci_files(ci) if ci else {}).items():
        files[relative] = (what, lambda text=text: text.encode())
    result = InitResult(directory)
    planned = {}
    for relative, (what, content) in files.items():
        if _existing_file(directory, relative):
            result.kept[relative] = what
        else:
            planned[relative] = content
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
    if path.is_symlink():
        target = path.resolve()
        if not target.is_relative_to(directory.resolve()):
            raise InitError(f"{path}: a symlink to {target}, outside the project; expected the project's own "
                            f"{GITIGNORE_FILE} (init appends {', '.join(IGNORED)} to it)")
        path = target
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
