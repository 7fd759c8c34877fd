"""What edgebuild's doit commands share: finding the workspace the dodo file opened,
artifact names on the command line, options anywhere among them, running doit's
``run`` with outcomes recorded, and the lock file refreshed afterwards.

The commands are entry points of the group ``doit.COMMAND`` (``pyproject.toml``):
doit loads the commands of every installed package from there, so installing
edgebuild gives every project these commands with no per-repo configuration.
Every command finds the dodo file the way doit's own do (``-f FILE``, ``-d DIR``,
``-k`` to seek it in parent directories) and works on the workspace that dodo
file opened. A command parses, calls the engine (``edgebuild/run/``) and prints;
it does no work of its own.
"""

from __future__ import annotations

import difflib
import os
import sys
from typing import TYPE_CHECKING, Any

from doit.cmd_base import DoitCmdBase
from doit.cmd_run import Run
from doit.exceptions import InvalidCommand

from edgebuild.cli.option_errors import option_problem, permuted
from edgebuild.errors import EdgebuildError
from edgebuild.run.scheduler import Outcomes, needs_a_worker, verification_summary
from edgebuild.run.workers import start_server_early

if TYPE_CHECKING:
    from edgebuild.core.project import Artifact
    from edgebuild.run.workspace import Workspace

JSON_OPTION = {"name": "as_json", "short": "", "long": "json", "type": bool, "default": False, "help": "print JSON"}
FAIL_FAST_OPTION = {
    "name": "fail_fast", "short": "", "long": "fail-fast", "type": bool, "default": False,
    "help": "stop at the first failure (by default every selected artifact is verified)",
}


def open_workspace(command: DoitCmdBase, params: Any) -> Any:
    """Import the dodo file as doit does and return the workspace it opened; merge its
    ``DOIT_CONFIG`` into ``params`` (as doit's ``execute`` does later)."""
    from edgebuild.cli.tasks import current_workspace
    from edgebuild.core.config import Settings

    if params.get("cwdPath"):
        params["cwdPath"] = os.path.abspath(params["cwdPath"])
    # Paths typed in the shell are relative to where the command was typed; doit is
    # about to change into the dodo file's directory (and workers start there): the
    # settings, read here, hold them absolute from now on.
    try:
        settings = Settings.from_environ()
        settings.apply(os.environ)
        # The keys named are readable ECDSA P-256 keys, before any task runs (the remote
        # cache, which uses them, is opened only when a task first needs it).
        from edgebuild.cache.signing import Trust

        Trust.from_settings(settings)
    except EdgebuildError as error:
        raise InvalidCommand(str(error)) from None
    command.loader.setup(params)
    # doit's execute imports the dodo file again, from the dodo file's directory (doit
    # has changed into it): from there only an absolute path names the same file.
    dodo_file = getattr(command.loader, "namespace", {}).get("__file__")
    if dodo_file:
        params["dodoFile"] = dodo_file
    params.update_defaults(command.loader.load_doit_config())
    return current_workspace()


def selected(args: list[str], workspace: Workspace) -> list[str]:
    """The artifact names given (all, in manifest order, when none are); an unknown one
    is an error with the closest match."""
    names = [artifact.name for artifact in workspace.order()]
    unknown = [arg for arg in args if arg not in names]
    if unknown:
        match = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise InvalidCommand(f"unknown artifact {unknown[0]!r}{hint}; `doit list` shows the artifacts")
    return args or names


def handles(workspace: Workspace, names: list[str]) -> list[Artifact]:
    """The artifacts ``names`` name (known names: :func:`selected` checked them)."""
    return [workspace.artifact(name) for name in names]


def options_first(args: list[str], options: list[Any]) -> list[str]:
    """``args`` with every option of ``options`` (doit's ``CmdOption``) moved ahead of the
    artifact names, with its value: doit's parser (``getopt``) stops at the first name, and
    ``doit publish NAME --to DEST`` is the natural order. ``getopt.gnu_getopt`` reads them
    wherever they are (up to ``--``); ``args`` that it refuses come back as they are, for
    :func:`~edgebuild.cli.option_errors.option_problem` to say what is wrong."""
    from doit.cmdparse import CmdParse

    parsed = permuted(CmdParse(options), args)
    if parsed is None:
        return args
    found, names, tail = parsed
    return [*found, *names, *tail]


class OneLineErrors:
    """The boundary of every edgebuild command: misused options and edgebuild's own errors
    (an unreachable remote cache among them) end it with one line, never with doit's
    list of option objects or a traceback."""

    def arranged(self, args: list[str]) -> list[str]:
        return args

    def get_backends(self):  # noqa: D102 - doit's signature
        from edgebuild.cli.doit_state import DoitState

        # doit's state file is a cache (``doit_state.py``): under doit's own name for its
        # JSON backend, the one the dodo file names (``doit_config``), so that another
        # package's command, which gets doit's own backend, reads and writes the same file.
        return {**super().get_backends(), "json": DoitState}  # type: ignore[misc]

    def parse_execute(self, in_args):  # noqa: D102 - doit's signature
        from doit.cmdparse import CmdParseError

        args = self.arranged(list(in_args))
        problem = option_problem(self.cmdparser, args, self.name,  # type: ignore[attr-defined]
                                 anywhere=isinstance(self, NamesAnywhere))
        if problem is not None:
            raise InvalidCommand(problem)
        try:
            return super().parse_execute(args)  # type: ignore[misc]
        except InvalidCommand as error:
            raise InvalidCommand(_invalid_command_line(error, self.name)) from None  # type: ignore[attr-defined]
        except CmdParseError as error:
            # A value from DOIT_CONFIG or the environment that does not parse.
            raise InvalidCommand(f"doit {self.name}: {' '.join(str(error).split())}") from None  # type: ignore[attr-defined]
        except EdgebuildError as error:
            fail(str(error))
            return 2
        except BrokenPipeError:
            from edgebuild.core.console import reader_gone

            return reader_gone()


class NamesAnywhere(OneLineErrors):
    """Options may follow the artifact names: ``doit verify NAME --fail-fast``."""

    def arranged(self, args: list[str]) -> list[str]:
        return options_first(args, self.get_options())  # type: ignore[attr-defined]


class WorkspaceCommand(OneLineErrors, DoitCmdBase):
    """A command that reads the workspace and runs no task: it finds the dodo file as
    doit does (``-f``, ``-d``, ``-k``), and needs nothing else of doit's."""

    def execute(self, params, args):  # noqa: D102 - doit's signature
        return self.run(open_workspace(self, params), params, args)

    def run(self, workspace: Workspace, params: Any, args: list[str]) -> int:
        raise NotImplementedError


def _invalid_command_line(error: InvalidCommand, command: str) -> str:
    """doit's message for a name it does not know (three lines, for ``doit NAME``), or any
    other of its command errors, as one line."""
    if error.not_found is not None:
        if command == "run":  # ``doit NAME``: NAME may be a mistyped command too
            return (f"unknown command, artifact or task {error.not_found!r}; `doit help` lists the commands, "
                    "`doit list` the artifacts")
        return f"unknown artifact or task {error.not_found!r}; `doit list` shows them"
    return " ".join(str(error).split())


# The exit status of a command stopped by Ctrl-C, as a shell reports a SIGINT (128 + 2).
INTERRUPTED = 130


def fail(message: str) -> None:
    print(f"edgebuild: error: {message}", file=sys.stderr, flush=True)


def _parallel_workers(jobs: int) -> None:
    """Prepare ``doit -n N``: doit's processes are spawned, not forked.

    By the time doit starts its processes this one has usually imported torch
    (generating a fixture, fingerprinting); a forked child inherits torch's OpenMP
    thread pool in a state it cannot use and hangs in its first parallel op.
    Spawned ones start clean."""
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)


class RecordingReporter:
    """doit's reporter ``base``, recording each task's outcome into ``outcomes`` (the
    scheduler's bookkeeping, the same the Python API keeps).

    Not a subclass made on the fly: ``doit -n N`` hands the reporter's class to its
    worker processes by name, so this one is importable, and set up through class
    attributes (one doit command runs per process). Workers only ask which
    methods it has; every call happens in the main process."""

    base: Any = None
    outcomes: Outcomes | None = None

    @classmethod
    def recording(cls, reporter: Any, reporters: dict[str, Any], outcomes: Outcomes) -> Any:
        """The reporter to give doit instead of ``reporter`` (a name or a class): it prints
        exactly what ``reporter`` would, and records into ``outcomes``."""
        base = reporters.get(reporter) if isinstance(reporter, str) else reporter
        if not isinstance(base, type):
            return reporter
        cls.base = base
        cls.outcomes = outcomes
        return cls

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        self.inner = type(self).base(outstream, options)

    @property
    def initialize(self) -> Any:
        # Optional: doit calls it only where the reporter has it (its json reporter has not).
        return self.inner.initialize

    def get_status(self, task: Any) -> None:
        self.inner.get_status(task)

    def execute_task(self, task: Any) -> None:
        self.inner.execute_task(task)

    def add_failure(self, task: Any, fail: Any) -> None:
        from doit.exceptions import UnmetDependency

        outcomes = type(self).outcomes
        if getattr(fail, "not_run", False):
            outcomes.not_run(task.name, fail.get_msg().strip())
        elif isinstance(fail, UnmetDependency):
            failed_sources = [dependency for dependency in task.task_dep
                              if dependency.startswith("verify:") and dependency in outcomes.failed]
            if failed_sources and task.name.startswith("verify:"):
                outcomes.not_run(task.name, f"{task.name.removeprefix('verify:')}: not run: its source "
                                            f"{failed_sources[0].removeprefix('verify:')} did not pass verification")
            else:
                outcomes.failure(task.name, None)
        else:
            outcomes.failure(task.name, str(fail))
        self.inner.add_failure(task, fail)

    def add_success(self, task: Any) -> None:
        type(self).outcomes.success(task.name)
        self.inner.add_success(task)

    def skip_uptodate(self, task: Any) -> None:
        type(self).outcomes.success(task.name)
        self.inner.skip_uptodate(task)

    def skip_ignore(self, task: Any) -> None:
        self.inner.skip_ignore(task)

    def cleanup_error(self, exception: Any) -> None:
        self.inner.cleanup_error(exception)

    def runtime_error(self, msg: str) -> None:
        self.inner.runtime_error(msg)

    def teardown_task(self, task: Any) -> None:
        self.inner.teardown_task(task)

    def complete_run(self) -> None:
        self.inner.complete_run()


def _start_server_if_needed(workspace: Workspace, chosen: list[str], verifying: bool, processes: int) -> None:
    """The fork server started now, beside doit's planning, where a worker will be needed:
    the half second or so until the first fork comes off the seconds its imports take.
    Not with a remote cache, which the parent asks first and which usually answers, nor
    where nothing may be exported here (``pull_only``: a cluster run's driver)."""
    if workspace.remote_cache_spec is not None or workspace.settings.pull_only:
        return
    artifacts = workspace.order(handles(workspace, chosen))
    if needs_a_worker(workspace, artifacts, verifying) and start_server_early(workspace, processes):
        # Time this process would spend waiting for the server: the judging code's
        # digests, which the lock file's refresh after the run needs, are taken now.
        try:
            for artifact in artifacts:
                workspace.verify_code(artifact)
                workspace.coverage_tools(artifact)
        except EdgebuildError:
            pass  # the lock file's refresh meets it again, and says so


def run_and_lock(command: Run, params: Any, workspace: Workspace, chosen: list[str], tasks: list[str],
                 verifying: bool = False, elsewhere: Outcomes | None = None) -> int:
    """doit's ``run`` of ``tasks``, then the lock file refreshed for ``chosen`` and
    what they depend on (the artifacts that are built at their current fingerprint).
    ``verifying``: go on after a failure (unless ``--fail-fast``), then print one
    summary line, counting what failed or was not run ``elsewhere`` (on a cluster)."""
    from edgebuild.core.lock_format import read_lock
    from edgebuild.run.lockfile import update_lock

    changes: dict[str, Any] = {}
    if params.get("num_process"):
        _parallel_workers(params["num_process"])
        changes["jobs"] = params["num_process"]
    if "verbosity" in getattr(params, "_non_default_keys", ()) and params["verbosity"] >= 2:
        changes["verbose"] = True
    if changes:
        workspace.configure(**changes)
    # The process boundary: doit's -n processes and every worker read the settings back.
    workspace.settings.apply(os.environ)
    try:
        # An unreadable lock file stops the command before it builds anything.
        read_lock(workspace.lock_path)
    except EdgebuildError as error:
        raise InvalidCommand(str(error)) from None
    _start_server_if_needed(workspace, chosen, verifying, params.get("num_process") or 1)
    outcomes = Outcomes()
    if params.get("fail_fast") and "continue" in getattr(params, "_non_default_keys", ()):
        raise InvalidCommand("--fail-fast stops at the first failure and --continue goes on after it: give one")
    if verifying and not params.get("fail_fast"):
        params["continue"] = True
    params["reporter"] = RecordingReporter.recording(params["reporter"], command.reporters, outcomes)
    try:
        result = Run.execute(command, params, tasks)
    except KeyboardInterrupt:
        # Ctrl-C: one line, not a traceback. A build or judgement cut short never counts
        # (its worker is interrupted and cleans up; nothing is renamed into build/ half
        # made); what finished before is kept, and the next run goes on from there.
        fail(f"interrupted (Ctrl-C): the {'verification' if verifying else 'build'} in progress was stopped and "
             "counts for nothing; what finished before it is kept: run the command again to go on")
        return INTERRUPTED
    try:
        # Frozen, the committed lock file is what the run read: it stays as it is.
        if not workspace.frozen:
            update_lock(workspace, workspace.order(handles(workspace, chosen)))
        workspace.save_caches()
    except EdgebuildError as error:
        fail(str(error))
        return result or 1
    if verifying:
        from doit.reporter import JsonReporter

        # doit's json reporter owns stdout: one JSON document, nothing after it.
        stream = sys.stderr if issubclass(RecordingReporter.base or object, JsonReporter) else sys.stdout
        # The artifacts asked for, and those they are made from whose verification failed
        # in this run (what held the others back).
        names = list(dict.fromkeys([*chosen, *(artifact.name for artifact in workspace.order(handles(workspace, chosen))
                                                if outcomes.failed.get(artifact.name)
                                                or outcomes.failed.get(f"verify:{artifact.name}"))]))
        for name in outcomes.verification(names)["not run"]:
            reason = outcomes.not_run_because.get(f"verify:{name}")
            if reason:
                print(f"  [{name}] {reason.removeprefix(f'{name}: ')}", file=stream, flush=True)
        if elsewhere is not None:
            # The cluster driver said its own reasons as they came; they count here.
            names = with_those_failed_elsewhere(workspace, names, elsewhere)
            outcomes = outcomes.merged(elsewhere)
        print(verification_summary(outcomes.verification(names)), file=stream, flush=True)
    return result


def with_those_failed_elsewhere(workspace: Workspace, names: list[str], elsewhere: Outcomes) -> list[str]:
    """``names`` and the artifacts that failed or were not run ``elsewhere`` (on a cluster),
    dependencies first: what a verification summary counts."""
    wanted = set(names) | {task for task in elsewhere.failed if not task.startswith("verify:")}
    return [artifact.name for artifact in workspace.order(handles(workspace, sorted(wanted))) if artifact.name in wanted]


def current_fingerprints(workspace: Workspace) -> dict[str, str]:
    """Artifact -> the fingerprint the manifest asks for now (artifacts in error, or whose
    sources are not built, left out)."""
    current = {}
    for artifact in workspace.order():
        try:
            current[artifact.name] = artifact.fingerprint
        except EdgebuildError:
            continue
    return current
