"""Manifest -> doit task dicts: what a project's ``dodo.py`` yields (through
``edgebuild.tasks``).

Each artifact is one task named after it (so ``doit list`` lists artifacts,
and ``doit info NAME`` / ``doit forget NAME`` / ``doit clean NAME`` work on
them), plus a ``verify:NAME`` subtask. Staleness is the scheduler's rule
(``edgebuild/run/scheduler.py``) through ``uptodate``, not doit's file checker,
which re-hashes whole multi-GB files; the actions are the scheduler's steps.

Actions receive only names and paths, never live objects: with ``doit -n 2``
they run in other processes, which open the workspace themselves (their settings
come through the environment the command wrote once, before doit started them).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from edgebuild.errors import EdgebuildError

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace

_WORKSPACES: dict[str, Any] = {}
# The workspace the dodo file loaded: what `doit status`, `doit gc`, ... work on.
_CURRENT: list[Any] = []


def workspace_for(manifest_path: str) -> Any:
    """The process-wide :class:`~edgebuild.run.workspace.Workspace` for this manifest
    (opened once per process, with this process's settings). Its build/, cache/ and
    lock file sit beside the manifest, whatever the cwd; messages name the manifest
    as ``manifest_path`` spells it."""
    from edgebuild.run.workspace import Workspace

    key = os.path.abspath(manifest_path)
    if key not in _WORKSPACES:
        _WORKSPACES[key] = Workspace.open(manifest_path)
    return _WORKSPACES[key]


def load_or_exit(manifest_path: str | None = None) -> Any:
    """Open the workspace for ``dodo.py``; a bad manifest (or setting) prints its error and
    exits 2 before doit does anything (no traceback, no output touched)."""
    from edgebuild.core.config import Settings
    from edgebuild.core.manifest import manifest_path as resolve

    if sys.argv[1:2] and sys.argv[1].startswith("-"):
        from edgebuild.cli.option_errors import options_before_the_command

        # `doit -P bogus build`: doit's own `run` parsed those, before any edgebuild command could.
        problem = options_before_the_command(sys.argv)
        if problem is not None:
            print(f"ERROR: {problem}", file=sys.stderr)
            raise SystemExit(3)
    try:
        settings = Settings.from_environ()
        if not settings.verbose:
            # Before anything here imports a library (a fixture generated, a processor checked).
            from edgebuild.core.console import quiet_logging

            quiet_logging()
        with collection_paused():
            workspace = workspace_for(str(resolve(manifest_path or settings.manifest)))
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    _CURRENT[:] = [workspace]
    return workspace


def current_workspace() -> Any:
    """The workspace the dodo file loaded (through :func:`load_or_exit`); the default
    manifest's when the dodo file loaded none."""
    return _CURRENT[0] if _CURRENT else load_or_exit()


def doit_config(workspace: Workspace) -> dict[str, Any]:
    # doit's state is a cache: read and written by ``edgebuild/cli/doit_state.py`` (under
    # the backend name "json"), which says in one line what it cannot read or write.
    return {
        "default_tasks": list(workspace.manifest.defaults),
        "dep_file": str(workspace.layout.cache_dir / "doit.json"),
        "backend": "json",
        "verbosity": 2,
    }


@contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: loading a manifest and generating its tasks
    allocate tens of thousands of objects that live as long as the command, and each
    collection on the way traverses all of them again (1.2 s of a 10,000-artifact
    `doit list`, 35% of it). Reference counting still frees what is dropped. What is
    left at the end moves out of the collector's sight for good (``gc.freeze``) before
    it is turned on again: else the first collection after traverses it all once more
    (0.24 s of the same `doit list`). `doit status` fingerprints its artifacts inside one too:
    their records live as long as the command."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


# While a `doit list` loads the tasks: whether it will show the verify:NAME tasks
# (:func:`verify_subtasks_only_if`).
_VERIFY_SUBTASKS_WANTED: list[Callable[[], bool]] = []


@contextmanager
def verify_subtasks_only_if(wanted: Callable[[], bool]) -> Iterator[None]:
    """Inside, the ``verify:NAME`` tasks are made only if ``wanted()`` says so when the
    tasks are generated (the ``verify`` group always is): for a `doit list` that shows
    groups only, whose output is the same either way. Asked then, not before: doit merges
    the dodo file's ``DOIT_CONFIG`` (which may ask for subtasks) into the command's options
    just before it loads the tasks. doit makes a task object of each dict, about 10 us
    apiece: the 10,000 subtasks were an eighth of a 10,000-artifact `doit list`."""
    _VERIFY_SUBTASKS_WANTED.append(wanted)
    try:
        yield
    finally:
        _VERIFY_SUBTASKS_WANTED.pop()


def artifact_tasks(workspace: Workspace) -> Iterator[dict[str, Any]]:
    """Two tasks an artifact (its build, ``verify:NAME``) and the ``verify`` group. doit
    makes each task from its dict before asking for the next, so the pause covers both;
    the tasks live until the command exits."""
    with collection_paused():
        yield from _task_dicts(workspace, verify_subtasks=not _VERIFY_SUBTASKS_WANTED or _VERIFY_SUBTASKS_WANTED[-1]())


def _task_dicts(workspace: Workspace, verify_subtasks: bool = True) -> Iterator[dict[str, Any]]:
    from edgebuild.run.scheduler import verify_dependencies

    manifest_path = str(workspace.manifest.path)
    # Paths as strings, each artifact's facts looked up once: a 10,000-artifact `doit list`
    # makes 20,001 of these dicts, and each pathlib join or property was a few percent of it.
    build_dir = str(workspace.layout.build_dir)
    ordered = workspace.order()
    for artifact in ordered:
        name = artifact.name
        params = artifact.params
        kind = artifact.kind
        yield {
            "basename": name,
            "doc": f"[{kind.name}] {params.description or kind.summary}",
            "actions": [(_build_action, [manifest_path, name])],
            "uptodate": [(_build_uptodate, [manifest_path, name])],
            "task_dep": params.source_artifacts(),
            "clean": [(_clean_action, [os.path.join(build_dir, name)])],
            "verbosity": 2,
        }
    yield {"basename": "verify", "name": None, "doc": "build what is stale, then verify every artifact"}
    for artifact in ordered if verify_subtasks else ():
        name = artifact.name
        yield {
            "basename": "verify",
            "name": name,
            "doc": f"verify {name} against its thresholds; writes build/{name}/report.json",
            "actions": [(_verify_action, [manifest_path, name])],
            "uptodate": [(_verify_uptodate, [manifest_path, name])],
            # Its build, and its sources' verifications: one whose source failed is not run.
            "task_dep": verify_dependencies(artifact),
            "verbosity": 2,
        }


def _failed(error: EdgebuildError) -> Any:
    from doit.exceptions import TaskFailed

    from edgebuild.errors import SourceNotVerified

    failure = TaskFailed(str(error))
    # Not a failure of its own: the reporter counts it as not run (the attribute travels
    # with the exception to doit's main process under -n N).
    failure.not_run = isinstance(error, SourceNotVerified)
    return failure


def _build_action(manifest_path: str, name: str) -> Any:
    from edgebuild.run import scheduler

    workspace = workspace_for(manifest_path)
    return _run_action(workspace, lambda: {"fingerprint": scheduler.build(workspace, workspace.artifact(name))})


def _verify_action(manifest_path: str, name: str) -> Any:
    from edgebuild.run import scheduler

    workspace = workspace_for(manifest_path)
    return _run_action(workspace, lambda: {"verify_fingerprint": scheduler.verify(workspace, workspace.artifact(name))})


def _run_action(workspace: Workspace, action: Callable[[], Any]) -> Any:
    """Run ``action``; an edgebuild error becomes doit's one-line task failure. The
    stat cache is saved either way (what was hashed stays hashed; one that cannot be
    saved says so itself, and fails nothing)."""
    try:
        result = action()
    except EdgebuildError as error:
        workspace.save_caches()
        return _failed(error)
    workspace.save_caches()
    return result


def _build_uptodate(task: Any, values: dict[str, Any], manifest_path: str, name: str) -> bool:
    from edgebuild.run.scheduler import needs_build

    return _uptodate(manifest_path, name, needs_build)


def _verify_uptodate(task: Any, values: dict[str, Any], manifest_path: str, name: str) -> bool:
    from edgebuild.run.scheduler import needs_verify

    return _uptodate(manifest_path, name, needs_verify)


def _uptodate(manifest_path: str, name: str, needs: Callable[[Any, Any], bool]) -> bool:
    workspace = workspace_for(manifest_path)
    try:
        return not needs(workspace, workspace.artifact(name))
    except EdgebuildError:
        # Not up to date: the action runs and reports the error properly.
        return False
    finally:
        workspace.save_caches()


def _clean_action(directory: str, dryrun: bool = False) -> None:
    # doit passes ``dryrun`` (and then runs this on ``doit clean -n`` too): say what would go.
    from edgebuild.core.console import shown_path

    if os.path.isdir(directory):
        if dryrun:
            print(f"would remove {shown_path(directory)}")
            return
        shutil.rmtree(directory)
        print(f"removed {shown_path(directory)}")
