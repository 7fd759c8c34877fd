"""doit commands: ``build``, ``verify`` and ``publish`` (doit's own ``run`` with the
task selection translated from artifact names, so every ``run`` option -- ``-n 2``,
``--continue``, ``-v 2`` -- keeps working), ``status``, ``cache``, ``gc``, and a
``clean`` that is doit's own without its per-action chatter.

They are entry points of the group ``doit.COMMAND`` (``pyproject.toml``): doit
loads the commands of every installed package from there, so installing
edgebuild gives every project these commands with no per-repo configuration.
Every command finds the dodo file the way doit's own do (``-f FILE``, ``-d DIR``,
``-k`` to seek it in parent directories) and works on the project that dodo file
loaded. ``build``, ``verify`` and ``publish`` then refresh the lock file
(``<manifest stem>.lock``) for the artifacts that are built.
"""

from __future__ import annotations

import difflib
import io
import re
import sys
import time
from typing import Any

from doit.cmd_base import DoitCmdBase
from doit.cmd_clean import Clean as DoitClean
from doit.cmd_run import Run
from doit.exceptions import InvalidCommand

from edgebuild.errors import EdgebuildError
from edgebuild.cli.options import PUBLISH_OPTIONS, RUN_OPTIONS
from edgebuild.cli.options import prepare as prepare_scaled


def _open_project(command: DoitCmdBase, params: Any) -> Any:
    """Import the dodo file as doit does and return the project it loaded; merge its
    ``DOIT_CONFIG`` into ``params`` (as doit's ``execute`` does later)."""
    import os

    from edgebuild.core.manifest import MANIFEST_ENV
    from edgebuild.core.project import REMOTE_CACHE_ENV, REMOTE_CACHE_OFF
    from edgebuild.cache.location import is_url
    from edgebuild.cli.tasks import current_project

    if params.get("cwdPath"):
        params["cwdPath"] = os.path.abspath(params["cwdPath"])
    # Paths typed in the shell are relative to where the command was typed; doit is
    # about to change into the dodo file's directory (and workers start there).
    for variable in (MANIFEST_ENV, REMOTE_CACHE_ENV):
        value = os.environ.get(variable, "")
        if value and value != REMOTE_CACHE_OFF and not is_url(value) and not os.path.isabs(os.path.expanduser(value)):
            os.environ[variable] = os.path.abspath(value)
    command.loader.setup(params)
    # doit's execute imports the dodo file again, from the dodo file's directory (doit
    # has changed into it): from there only an absolute path names the same file.
    dodo_file = getattr(command.loader, "namespace", {}).get("__file__")
    if dodo_file:
        params["dodoFile"] = dodo_file
    params.update_defaults(command.loader.load_doit_config())
    return current_project()


def _selected(args: list[str], names: list[str]) -> list[str]:
    unknown = [arg for arg in args if arg not in names]
    if unknown:
        match = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise InvalidCommand(f"unknown artifact {unknown[0]!r}{hint}; `doit list` shows the artifacts")
    return args or names


def _options_first(args: list[str], options: list[Any]) -> list[str]:
    """``args`` with every option of ``options`` (doit's ``CmdOption``) moved ahead of the
    artifact names, with its value. doit's parser (getopt) stops at the first name, and
    ``doit publish NAME --to DEST`` is the natural order."""
    takes_value: dict[str, bool] = {}
    for option in options:
        for flag in (f"-{option.short}" if option.short else "", f"--{option.long}" if option.long else ""):
            if flag:
                takes_value[flag] = option.type is not bool
        if option.inverse:
            takes_value[f"--{option.inverse}"] = False
    moved: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            rest.extend(args[index:])
            break
        flag = arg.split("=", 1)[0]
        if flag not in takes_value and not arg.startswith("--") and arg[:2] in takes_value:
            flag = arg[:2]  # a short option with its value attached: -n2
        if arg.startswith("-") and flag in takes_value:
            moved.append(arg)
            if takes_value[flag] and arg == flag and index + 1 < len(args):
                moved.append(args[index + 1])
                index += 1
        else:
            rest.append(arg)
        index += 1
    return moved + rest


class _NamesAnywhere:
    """Options may follow the artifact names: ``doit verify NAME --fail-fast``."""

    def parse_execute(self, in_args):  # noqa: D102 - doit's signature
        return super().parse_execute(_options_first(list(in_args), self.get_options()))  # type: ignore[misc]


def _parallel_workers(jobs: int) -> None:
    """Prepare ``doit -n N``: workers are spawned, not forked, and share the cores.

    By the time doit starts its workers this process has usually imported torch
    (generating a fixture, fingerprinting); a forked child inherits torch's
    OpenMP thread pool in a state it cannot use and hangs in its first parallel
    op. Spawned workers start clean. Each then takes cores / N threads, so that
    N exports do not fight over every core (``EDGEBUILD_JOBS``, read in tasks.py).
    """
    import multiprocessing
    import os

    multiprocessing.set_start_method("spawn", force=True)
    os.environ["EDGEBUILD_JOBS"] = str(jobs)


class TaskOutcomes:
    """What doit's reporter was told about each task: succeeded (run or up to date),
    or failed and why (a failure of its own, or one of a task it depends on)."""

    def __init__(self) -> None:
        self.succeeded: set[str] = set()
        self.failed: dict[str, Any] = {}

    def recording(self, reporter: Any, reporters: dict[str, Any]) -> Any:
        """The reporter to give doit instead of ``reporter`` (a name or a class): it
        prints exactly what ``reporter`` would, and records here."""
        base = reporters.get(reporter) if isinstance(reporter, str) else reporter
        if not isinstance(base, type):
            return reporter
        RecordingReporter.base = base
        RecordingReporter.outcomes = self
        return RecordingReporter

    def verification(self, names: list[str]) -> dict[str, list[str]]:
        """``names`` sorted into passed (verified now or already), failed (its build or
        its verification failed) and not run (something it depends on failed, or doit
        stopped before reaching it)."""
        from doit.exceptions import UnmetDependency

        sorted_names: dict[str, list[str]] = {"passed": [], "failed": [], "not run": []}
        for name in names:
            own = [self.failed[task] for task in (name, f"verify:{name}") if task in self.failed]
            if any(not isinstance(failure, UnmetDependency) for failure in own):
                sorted_names["failed"].append(name)
            elif f"verify:{name}" in self.succeeded:
                sorted_names["passed"].append(name)
            else:
                sorted_names["not run"].append(name)
        return sorted_names


class RecordingReporter:
    """doit's reporter ``base``, recording each task's outcome into ``outcomes``.

    Not a subclass made on the fly: ``doit -n N`` hands the reporter's class to its
    worker processes by name, so this one is importable, and set up through class
    attributes (one doit command runs per process). Workers only ask which
    methods it has; every call happens in the main process."""

    base: Any = None
    outcomes: TaskOutcomes | None = None

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
        type(self).outcomes.failed[task.name] = fail
        self.inner.add_failure(task, fail)

    def add_success(self, task: Any) -> None:
        type(self).outcomes.succeeded.add(task.name)
        self.inner.add_success(task)

    def skip_uptodate(self, task: Any) -> None:
        type(self).outcomes.succeeded.add(task.name)
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


def verification_summary(outcome: dict[str, list[str]]) -> str:
    """``verify: 2 passed, 1 failed (strict), 1 not run (strict_onnx)``"""
    parts = []
    for state in ("passed", "failed", "not run"):
        names = outcome[state]
        parts.append(f"{len(names)} {state}" + (f" ({', '.join(names)})" if names and state != "passed" else ""))
    return "verify: " + ", ".join(parts)


_JSON_OPTION = {"name": "as_json", "short": "", "long": "json", "type": bool, "default": False, "help": "print JSON"}
_FAIL_FAST_OPTION = {
    "name": "fail_fast", "short": "", "long": "fail-fast", "type": bool, "default": False,
    "help": "stop at the first failure (by default every selected artifact is verified)",
}


def _run_and_lock(command: Run, params: Any, project: Any, selected: list[str], tasks: list[str],
                  verifying: bool = False, failed_elsewhere: list[str] = ()) -> int:
    """doit's ``run`` of ``tasks``, then the lock file refreshed for ``selected`` and
    what they depend on (the artifacts that are built at their current fingerprint).
    ``verifying``: go on after a failure (unless ``--fail-fast``), then print one
    summary line, counting ``failed_elsewhere`` (on a cluster) as failed."""
    from edgebuild.core.console import set_verbose
    from edgebuild.errors import LockfileError
    from edgebuild.run.lockfile import read_lock, update_lock

    if params.get("num_process"):
        _parallel_workers(params["num_process"])
    if "verbosity" in getattr(params, "_non_default_keys", ()) and params["verbosity"] >= 2:
        set_verbose()
    try:
        # An unreadable lock file stops the command before it builds anything.
        read_lock(project.lock_path)
    except LockfileError as error:
        raise InvalidCommand(str(error)) from None
    outcomes = TaskOutcomes()
    if verifying and not params.get("fail_fast"):
        params["continue"] = True
    params["reporter"] = outcomes.recording(params["reporter"], command.reporters)
    result = Run.execute(command, params, tasks)
    try:
        update_lock(project, project.manifest.order(selected))
        project.save_caches()
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
        return result or 1
    if verifying:
        from doit.reporter import JsonReporter

        # doit's json reporter owns stdout: one JSON document, nothing after it.
        stream = sys.stderr if issubclass(RecordingReporter.base or object, JsonReporter) else sys.stdout
        outcome = outcomes.verification(selected)
        outcome["failed"] += list(failed_elsewhere)
        print(verification_summary(outcome), file=stream, flush=True)
    return result


class Build(_NamesAnywhere, Run):
    name = "build"
    doc_purpose = "build artifacts (all, or the ones named) and what they depend on"
    doc_usage = "[--shard I/N] [--dask ADDRESS] [ARTIFACT ...]"
    doc_description = (
        "Rebuilds only what is stale; up-to-date artifacts are skipped. Refreshes the lock file "
        "(<manifest stem>.lock) for what is built."
    )
    cmd_options = Run.cmd_options + RUN_OPTIONS

    def execute(self, params, args):  # noqa: D102 - doit's signature
        project = _open_project(self, params)
        selected = _selected(args, project.manifest.order())
        prepared = prepare_scaled(project, params, selected, verify=False)
        if not prepared.selected:
            return prepared.status
        return _run_and_lock(self, params, project, prepared.selected, prepared.selected) or prepared.status


class Verify(_NamesAnywhere, Run):
    name = "verify"
    doc_purpose = "build what is stale, then verify artifacts (all, or the ones named)"
    doc_usage = "[--shard I/N] [--dask ADDRESS] [ARTIFACT ...] [--fail-fast]"
    doc_description = (
        "Verifies every selected artifact even when one fails, then prints one line: how many passed, "
        "failed and were not run (their build, or a source's, failed). Writes build/<name>/report.json "
        "and report.md, refreshes the lock file; exits non-zero if anything failed."
    )
    cmd_options = Run.cmd_options + (_FAIL_FAST_OPTION,) + RUN_OPTIONS

    def execute(self, params, args):  # noqa: D102 - doit's signature
        project = _open_project(self, params)
        selected = _selected(args, project.manifest.order())
        prepared = prepare_scaled(project, params, selected, verify=True)
        if not prepared.selected:
            # An empty shard, or everything failed on the cluster (doit would run the default tasks).
            if prepared.failed:
                print(verification_summary({"passed": [], "failed": prepared.failed, "not run": []}), flush=True)
            return prepared.status
        tasks = [f"verify:{name}" for name in prepared.selected]
        result = _run_and_lock(self, params, project, prepared.selected, tasks, verifying=True,
                               failed_elsewhere=prepared.failed)
        return result or prepared.status


class Publish(_NamesAnywhere, Run):
    name = "publish"
    doc_purpose = "verify artifacts (all, or the ones named), then publish them to DEST"
    doc_usage = "[ARTIFACT ...] --to DEST [--allow-dirty] [--pull-only]"
    doc_description = (
        "DEST is a directory or an fsspec URL (file://, s3://bucket/prefix, ...). Each artifact goes to "
        "DEST/<artifact>/<fingerprint>/ with its report, provenance.json and SHA256SUMS; DEST/index.json "
        "lists them. Publishes nothing, and exits non-zero, unless every artifact named verified. Refuses "
        "a work tree with uncommitted changes, or outside git, unless --allow-dirty (then recorded in "
        "provenance.json)."
    )
    cmd_options = Run.cmd_options + (
        {"name": "to", "short": "", "long": "to", "type": str, "default": "",
         "help": "where to publish: a directory or an fsspec URL"},
        {"name": "allow_dirty", "short": "", "long": "allow-dirty", "type": bool, "default": False,
         "help": "publish from uncommitted changes or outside git (recorded in provenance.json)"},
        _FAIL_FAST_OPTION,
    ) + PUBLISH_OPTIONS

    def execute(self, params, args):  # noqa: D102 - doit's signature
        from edgebuild.errors import PublishError
        from edgebuild.run.publish import check_publishable, check_work_tree, publish

        if not params["to"]:
            raise InvalidCommand("give --to DEST: a directory or an fsspec URL such as s3://bucket/artifacts")
        project = _open_project(self, params)
        selected = _selected(args, project.manifest.order())
        try:
            # Before anything is built: what would be published must be what is committed.
            check_work_tree(project, allow_dirty=params["allow_dirty"])
        except EdgebuildError as error:
            print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
            return 3
        prepared = prepare_scaled(project, params, selected, verify=True)  # --remote-readonly, --pull-only
        if prepared.status:
            return prepared.status
        result = _run_and_lock(self, params, project, selected, [f"verify:{name}" for name in selected], verifying=True)
        try:
            check_publishable(project, selected)
            if result != 0:
                raise PublishError("nothing published: a task failed (see above)")
            publish(project, selected, params["to"], log=lambda message: print(message, flush=True),
                    allow_dirty=params["allow_dirty"])
        except EdgebuildError as error:
            print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
            return result or 1
        return 0


_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``500M``, ``20G``, ``1.5g`` -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"--max-size: expected a size like 500M or 20G, found {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_age(text: str) -> float:
    """``12h``, ``30d`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise ValueError(f"--max-age: expected an age like 12h or 30d, found {text!r}")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


class _ProjectCommand(DoitCmdBase):
    """A command that reads the project and runs no task: it finds the dodo file as
    doit does (``-f``, ``-d``, ``-k``), and needs nothing else of doit's."""

    def execute(self, params, args):  # noqa: D102 - doit's signature
        return self.run(_open_project(self, params), params, args)

    def run(self, project: Any, params: Any, args: list[str]) -> int:
        raise NotImplementedError


class Status(_NamesAnywhere, _ProjectCommand):
    name = "status"
    doc_purpose = "say which artifacts are up to date, stale (and why), missing, or in error"
    doc_usage = "[ARTIFACT ...] [--check] [--json]"
    doc_description = (
        "Reads fingerprints only (through the stat cache); builds nothing. Exits 1 when an artifact is "
        "in error (its parameters or inputs cannot be read); with --check, also when one is stale or missing."
    )
    cmd_options = (
        _JSON_OPTION,
        {"name": "check", "short": "", "long": "check", "type": bool, "default": False,
         "help": "exit 1 unless every artifact is up to date (for CI)"},
    )

    def run(self, project, params, args):  # noqa: D102
        import json

        from edgebuild.run.state import artifact_status

        selected = _selected(args, list(project.manifest.order()))
        states = [artifact_status(project, name) for name in selected]
        project.save_caches()
        if params["as_json"]:
            print(json.dumps(states, indent=2))
        else:
            width = max(len(name) for name in selected)
            for state in states:
                line = f"{state['artifact']:<{width}}  {state['state']}"
                if state.get("note"):
                    line += f" ({state['note']})"
                print(line)
                for reason in state.get("reasons", []):
                    print(f"{'':<{width}}    - {reason}")
        sys.stdout.flush()
        counts: dict[str, int] = {}
        for state in states:
            counts[state["state"]] = counts.get(state["state"], 0) + 1
        not_current = {key: count for key, count in counts.items() if key != "up to date"}
        if counts.get("error") or (params["check"] and not_current):
            summary = ", ".join(f"{count} {key}" for key, count in sorted(not_current.items()))
            print(f"edgebuild: status: {summary} (of {len(states)})", file=sys.stderr, flush=True)
            return 1
        return 0


class Report(_ProjectCommand):
    name = "report"
    doc_purpose = "write build/index.html: every artifact, its state, its checks and plots"
    doc_usage = ""
    doc_description = "One static page beside the manifest; builds and verifies nothing (run `doit verify` first)."

    def run(self, project, params, args):  # noqa: D102
        from edgebuild.cli.report_page import write_report_page

        path = write_report_page(project)
        project.save_caches()
        print(path)
        return 0


class Cache(_NamesAnywhere, _ProjectCommand):
    name = "cache"
    doc_purpose = "list what the local store and the remote cache hold"
    doc_usage = "[ARTIFACT ...] [--json]"
    doc_description = (
        "One line per build kept: the artifact, its fingerprint, its size and its age (local store: "
        "since last used; remote cache: since pushed). 'current' marks the build the manifest asks for now."
    )
    cmd_options = (
        _JSON_OPTION,
    )

    def run(self, project, params, args):  # noqa: D102
        import json

        from edgebuild.core.console import format_age, format_size
        from edgebuild.core.console import shown_path

        current = _current_fingerprints(project)
        now = time.time()
        sections = [
            ("local store", shown_path(project.store.root),
             [(entry.artifact, entry.fingerprint, entry.size, entry.last_used) for entry in project.store.entries()])
        ]
        if project.remote_cache is not None:
            try:
                remote = [(entry.artifact, entry.fingerprint, entry.size, entry.pushed)
                          for entry in project.remote_cache.entries()]
            except EdgebuildError as error:
                print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
                return 1
            sections.append(("remote cache", project.remote_cache.label, remote))
        if args:
            sections = [(title, where, [row for row in rows if row[0] in args]) for title, where, rows in sections]
        if params["as_json"]:
            print(json.dumps([
                {"where": title, "location": where, "entries": [
                    {"artifact": artifact, "fingerprint": fingerprint, "size": size, "time": stamp,
                     "current": current.get(artifact) == fingerprint}
                    for artifact, fingerprint, size, stamp in rows]}
                for title, where, rows in sections], indent=2))
            return 0
        for title, where, rows in sections:
            total = sum(row[2] for row in rows)
            count = f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"
            print(f"{title} ({where}): {count}, {format_size(total)}")
            if not rows:
                continue
            table = [("ARTIFACT", "FINGERPRINT", "SIZE", "LAST USED" if title == "local store" else "PUSHED", "")]
            for artifact, fingerprint, size, stamp in sorted(rows, key=lambda row: (str(row[0]), -(row[3] or 0))):
                table.append((
                    artifact or "?", fingerprint[:12], format_size(size),
                    f"{format_age(now - stamp)} ago" if stamp else "?",
                    "current" if current.get(artifact) == fingerprint else "",
                ))
            widths = [max(len(row[column]) for row in table) for column in range(4)]
            for row in table:
                print(("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4]).rstrip())
        if project.remote_cache is None:
            print("remote cache: none (set remote_cache in the manifest, or EDGEBUILD_REMOTE_CACHE)")
        return 0


def _current_fingerprints(project: Any) -> dict[str, str]:
    """Artifact -> the fingerprint the manifest asks for now (artifacts in error left out)."""
    current = {}
    for name in project.manifest.artifacts:
        try:
            current[name] = project.fingerprint(name)
        except EdgebuildError:
            continue
    return current


class Gc(_ProjectCommand):
    name = "gc"
    doc_purpose = "prune the local store (cache/store) by size and/or age"
    doc_usage = "[--max-size 20G] [--max-age 30d] [--dry-run]"
    doc_description = (
        "The builds the manifest asks for now are always kept. With neither limit, removes only what "
        "interrupted writes left behind and says what the store holds."
    )
    cmd_options = (
        {"name": "max_size", "short": "", "long": "max-size", "type": str, "default": "",
         "help": "keep the store under this size (e.g. 500M, 20G)"},
        {"name": "max_age", "short": "", "long": "max-age", "type": str, "default": "",
         "help": "remove entries unused for longer than this (e.g. 12h, 30d)"},
        {"name": "dry_run", "short": "", "long": "dry-run", "type": bool, "default": False,
         "help": "only say what would be removed"},
    )

    def run(self, project, params, args):  # noqa: D102
        from edgebuild.core.console import format_age, format_size

        try:
            max_bytes = parse_size(params["max_size"]) if params["max_size"] else None
            max_age = parse_age(params["max_age"]) if params["max_age"] else None
        except ValueError as error:
            raise InvalidCommand(str(error)) from None
        store = project.store
        keep = set(_current_fingerprints(project).values())
        if max_bytes is None and max_age is None:
            leftovers = 0 if params["dry_run"] else store.remove_leftovers()
            entries = list(store.entries())
            kept = [entry for entry in entries if entry.fingerprint in keep]
            print(
                f"the store holds {len(entries)} entries, {format_size(sum(entry.size for entry in entries))} "
                f"({len(kept)} current, {format_size(sum(entry.size for entry in kept))})"
                + (f"; removed {leftovers} leftovers of interrupted writes" if leftovers else "")
            )
            print("to prune it, give --max-size and/or --max-age (e.g. doit gc --max-age 30d; --dry-run to preview)")
            return 0
        removed = store.gc(max_bytes, max_age, keep, dry_run=params["dry_run"])
        if not params["dry_run"]:
            store.remove_leftovers()
        verb = "would remove" if params["dry_run"] else "removed"
        now = time.time()
        for entry in removed:
            print(f"{verb} {entry.artifact or '?'} {entry.fingerprint[:12]} "
                  f"({format_size(entry.size)}, last used {format_age(now - entry.last_used)} ago)")
        total = sum(entry.size for entry in removed)
        print(f"{verb} {len(removed)} entr{'y' if len(removed) == 1 else 'ies'}, {format_size(total)}")
        return 0


class Clean(DoitClean):
    """doit's ``clean``, saying what it removes: doit writes ``NAME - executing 'Python:
    function _clean_action'`` for every clean action and keeps what the action printed
    to itself; here the action's own line (``removed build/NAME``) is shown, and
    doit's only with ``-v`` (or ``EDGEBUILD_VERBOSE=1``)."""

    name = "clean"
    doc_purpose = "remove the built artifacts (build/<name>; the store keeps them)"
    cmd_options = DoitClean.cmd_options + (
        {"name": "verbose", "short": "v", "long": "verbose", "type": bool, "default": False,
         "help": "also show each clean action doit executes"},
    )

    def _execute(self, dryrun, cleandep, cleanall, cleanforget, verbose=False, pos_args=None):  # noqa: D102
        from edgebuild.core.console import verbose as verbose_from_environment

        self._show_doit_lines = verbose or verbose_from_environment()
        return super()._execute(dryrun, cleandep, cleanall, cleanforget, pos_args=pos_args)

    def clean_tasks(self, tasks, dryrun, cleanforget):  # noqa: D102 - doit's signature
        shown = self.outstream
        if not self._show_doit_lines:
            self.outstream = io.StringIO()
        try:
            super().clean_tasks(tasks, dryrun, cleanforget)
        finally:
            self.outstream = shown
        if self._show_doit_lines:
            return  # doit wrote the actions' output too
        seen = set()
        for task in tasks:
            if task.name in seen:
                continue
            seen.add(task.name)
            for action in task.clean_actions:
                if getattr(action, "out", None):
                    shown.write(action.out)
        shown.flush()
