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
- ``.gitignore`` lines for ``build/`` and ``cache/``, appended to an existing one.

Nothing that exists is overwritten: an existing file is kept as it is and named
in the summary, with what would have been written.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_FILE = "edgebuild.schema.json"
MANIFEST_FILE = "artifacts.yaml"
DODO_FILE = "dodo.py"
GITIGNORE_FILE = ".gitignore"
IGNORED = ("/build/", "/cache/")

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


def init_project(directory: Path) -> InitResult:
    """Write the starter files into ``directory`` (created if missing); keep every
    file that exists."""
    from edgebuild.core.manifest import manifest_json_schema

    directory.mkdir(parents=True, exist_ok=True)
    result = InitResult(directory)
    files: dict[str, tuple[str, object]] = {
        DODO_FILE: ("the doit entry point", lambda: DODO.encode()),
        MANIFEST_FILE: ("a starter manifest, one artifact of each kind", lambda: starter_manifest().encode()),
        SCHEMA_FILE: ("the manifest's JSON Schema", lambda: (json.dumps(manifest_json_schema(), indent=2) + "\n").encode()),
    }
    for relative, content in sample_files().items():
        files[relative] = ("a generated sample input", content)
    for relative, (what, content) in files.items():
        path = directory / relative
        if path.exists() or path.is_symlink():
            result.kept[relative] = what
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        # Exclusive creation: a file that appeared meanwhile is still never overwritten.
        try:
            with open(path, "xb") as handle:
                handle.write(content())  # type: ignore[operator]
        except FileExistsError:
            result.kept[relative] = what
            continue
        result.written.append(relative)
    _ignore_outputs(directory / GITIGNORE_FILE, result)
    return result


def _ignore_outputs(path: Path, result: InitResult) -> None:
    """Add the lines that keep ``build/`` and ``cache/`` out of git, unless present."""
    existing = path.read_text(encoding="utf-8") if path.exists() else None
    present = {line.strip() for line in (existing or "").splitlines()}
    # Any usual spelling of the same rule counts as present.
    missing = [line for line in IGNORED if not present & {line, line.strip("/"), line.lstrip("/"), line.rstrip("/")}]
    if not missing:
        return
    with open(path, "a", encoding="utf-8") as handle:
        if existing and not existing.endswith("\n"):
            handle.write("\n")
        if existing is None:
            handle.write("# edgebuild's outputs and caches (rebuilt from the manifest)\n")
        handle.write("".join(line + "\n" for line in missing))
    if existing is None:
        result.written.append(GITIGNORE_FILE)
    else:
        result.appended.extend(missing)


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
    """Files in folders (the sample inputs) as one ``data/calibration/*.png``-style item per
    folder and suffix; files at the top as they are."""
    shown: list[str] = []
    for path in paths:
        folder, _, name = path.rpartition("/")
        suffix = Path(name).suffix
        item = f"{folder}/*{suffix}" if folder and suffix else path
        if item not in shown:
            shown.append(item)
    return shown


def _grouped_kept(kept: dict[str, str]) -> dict[str, str]:
    grouped: dict[str, str] = {}
    for path, what in kept.items():
        (item,) = _grouped([path])
        grouped.setdefault(item, what if item == path else "generated sample inputs")
    return grouped
