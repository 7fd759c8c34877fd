"""Manifest -> doit task dicts.

Each artifact is one task named after it (so ``doit list`` lists artifacts,
and ``doit info NAME`` / ``doit forget NAME`` / ``doit clean NAME`` work on
them), plus a ``verify:NAME`` subtask. Staleness is decided by edgebuild's own
fingerprints (``uptodate``), not by doit's file checker, which re-hashes whole
multi-GB files.

Actions receive only names and paths, never live objects: with ``doit -n 2``
they run in other processes, which load the project themselves.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

from edgebuild.errors import EdgebuildError

_PROJECTS: dict[str, Any] = {}
# The project the dodo file loaded: what `doit status`, `doit gc`, ... work on.
_CURRENT: list[Any] = []


def project_for(manifest_path: str) -> Any:
    """The process-wide :class:`Project` for this manifest (loaded once per process).
    Its build/, cache/ and lock file sit beside the manifest, whatever the cwd;
    messages name the manifest as ``manifest_path`` spells it."""
    from edgebuild.core.project import Project

    key = os.path.abspath(manifest_path)
    if key not in _PROJECTS:
        _PROJECTS[key] = Project.load(manifest_path)
    return _PROJECTS[key]


def load_or_exit(manifest_path: str | None = None) -> Any:
    """Load the project for ``dodo.py``; a bad manifest prints its error and exits 2
    before doit does anything (no traceback, no output touched)."""
    from edgebuild.core.manifest import manifest_path as resolve

    try:
        project = project_for(str(resolve(manifest_path)))
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    _CURRENT[:] = [project]
    return project


def current_project() -> Any:
    """The project the dodo file loaded (through :func:`load_or_exit`); the default
    manifest's when the dodo file loaded none."""
    return _CURRENT[0] if _CURRENT else load_or_exit()


def doit_config(project: Any) -> dict[str, Any]:
    dep_file = project.layout.cache_dir / "doit.json"
    # doit writes its state when it finishes, failed tasks included: a first run that
    # fails before anything made cache/ (a checkpoint not found) would end in doit's
    # traceback instead of the one-line error.
    try:
        dep_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        print(f"edgebuild: error: {dep_file.parent}: cannot create the cache directory ({error.strerror})", file=sys.stderr)
        raise SystemExit(2) from None
    _set_aside_unreadable_state(dep_file)
    return {
        "default_tasks": list(project.manifest.defaults),
        "dep_file": str(dep_file),
        "backend": "json",
        "verbosity": 2,
    }


def _set_aside_unreadable_state(dep_file: Path) -> None:
    """doit stops with a traceback on a state file that is not JSON (a killed write, a
    full disk). Its state only remembers what edgebuild's fingerprints decide anyway,
    so an unreadable one is moved aside, said in one line, and started afresh."""
    import json

    try:
        json.loads(dep_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return
    except (OSError, ValueError) as error:
        aside = dep_file.with_name(dep_file.name + ".unreadable")
        try:
            os.replace(dep_file, aside)
        except OSError as move_error:
            print(f"edgebuild: error: {dep_file}: unreadable doit state ({error}); cannot move it aside ({move_error.strerror})",
                  file=sys.stderr)
            raise SystemExit(2) from None
        print(f"edgebuild: {dep_file}: unreadable doit state ({error}); moved to {aside.name}, starting afresh "
              "(edgebuild's fingerprints decide what is stale)", file=sys.stderr)


def artifact_tasks(project: Any) -> Iterator[dict[str, Any]]:
    from edgebuild.kinds import get_kind

    manifest_path = str(project.manifest.path)
    for name in project.manifest.order():
        params = project.manifest.artifacts[name]
        kind = get_kind(params.kind)
        description = params.description or kind.summary
        yield {
            "basename": name,
            "doc": f"[{kind.name}] {description}",
            "actions": [(_build_action, [manifest_path, name])],
            "uptodate": [(_build_uptodate, [manifest_path, name])],
            "task_dep": list(params.source_artifacts()),
            "clean": [(_clean_action, [str(project.layout.artifact_dir(name))])],
            "verbosity": 2,
        }
    yield {"basename": "verify", "name": None, "doc": "build what is stale, then verify every artifact"}
    for name in project.manifest.order():
        yield {
            "basename": "verify",
            "name": name,
            "doc": f"verify {name} against its thresholds; writes build/{name}/report.json",
            "actions": [(_verify_action, [manifest_path, name])],
            "uptodate": [(_verify_uptodate, [manifest_path, name])],
            "task_dep": [name],
            "verbosity": 2,
        }


def _failed(error: EdgebuildError) -> Any:
    from doit.exceptions import TaskFailed

    return TaskFailed(str(error))


def _build_action(manifest_path: str, name: str) -> Any:
    # The export runs in a worker process of its own (edgebuild/workers.py).
    from edgebuild.run.workers import build_in_worker

    project = project_for(manifest_path)
    return _run_action(project, lambda: build_in_worker(project, name))


def _verify_action(manifest_path: str, name: str) -> Any:
    # The verification runs in a worker process of its own (edgebuild/workers.py).
    from edgebuild.run.workers import verify_in_worker

    project = project_for(manifest_path)
    return _run_action(project, lambda: verify_in_worker(project, name))


def _run_action(project: Any, action: Any) -> Any:
    """Run ``action``; an edgebuild error becomes doit's one-line task failure. The
    stat cache is saved either way (what was hashed stays hashed); failing to save it
    fails the task only when nothing failed before."""
    try:
        result = action()
    except EdgebuildError as error:
        _save_caches(project)
        return _failed(error)
    try:
        project.save_caches()
    except EdgebuildError as error:
        return _failed(error)
    return result


def _save_caches(project: Any) -> None:
    """Save the stat cache where a failure to save is not the story (an up-to-date
    check, or after another error): the next action reports it if it persists."""
    try:
        project.save_caches()
    except EdgebuildError:
        pass


def _build_uptodate(task: Any, values: dict[str, Any], manifest_path: str, name: str) -> bool:
    from edgebuild.run.builder import is_built

    project = project_for(manifest_path)
    try:
        return values.get("fingerprint") == project.fingerprint(name) and is_built(project, name)
    except EdgebuildError:
        # Not up to date: the action runs and reports the error properly.
        return False
    finally:
        _save_caches(project)


def _verify_uptodate(task: Any, values: dict[str, Any], manifest_path: str, name: str) -> bool:
    from edgebuild.core.record import VerificationState, verification_state

    project = project_for(manifest_path)
    try:
        if values.get("verify_fingerprint") != project.verify_fingerprint(name):
            return False
        if verification_state(project, name) is not VerificationState.VERIFIED:
            return False
        # Verified before the remote cache was set (or before it lost the entry):
        # verify again, which pushes it, so that what is verified here is shared.
        # A read-only remote (pull requests) takes no push, so it is not waited for.
        return project.remote_cache is None or not project.remote_cache.takes_pushes(project.fingerprint(name))
    except EdgebuildError:
        return False
    finally:
        _save_caches(project)


def _clean_action(directory: str, dryrun: bool = False) -> None:
    # doit passes ``dryrun`` (and then runs this on ``doit clean -n`` too): say what would go.
    from edgebuild.core.console import shown_path

    if os.path.isdir(directory):
        if dryrun:
            print(f"would remove {shown_path(directory)}")
            return
        shutil.rmtree(directory)
        print(f"removed {shown_path(directory)}")
