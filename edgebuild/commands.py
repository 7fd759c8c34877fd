"""doit commands: ``doit build [NAME...]``, ``doit verify [NAME...]`` and
``doit publish [NAME...] --to DEST``.

They are doit's own ``run`` with the task selection translated from artifact
names, so every ``run`` option (``-n 2``, ``--continue``, ``-v``) keeps working.
After running, each rewrites the lock file (``artifacts.lock``) for the
artifacts it ran. Registered in ``pyproject.toml`` under
``[tool.doit.plugins.command]``.
"""

from __future__ import annotations

import difflib
import re

from doit.cmd_base import Command
from doit.cmd_run import Run
from doit.exceptions import InvalidCommand

from .errors import EdgebuildError
from .scale_options import PUBLISH_OPTIONS, RUN_OPTIONS
from .scale_options import prepare as prepare_scaled


def _artifact_names() -> list[str]:
    from .tasks import load_or_exit

    return list(load_or_exit().manifest.order())


def _selected(args: list[str], names: list[str]) -> list[str]:
    unknown = [arg for arg in args if arg not in names]
    if unknown:
        match = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f" (did you mean {match[0]!r}?)" if match else ""
        raise InvalidCommand(f"unknown artifact {unknown[0]!r}{hint}; `doit list` shows the artifacts")
    return args or names


def _option_first(args: list[str], option: str) -> list[str]:
    """``args`` with every ``option VALUE`` / ``option=VALUE`` moved to the front."""
    moved: list[str] = []
    rest: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            rest.extend(args[index:])
            break
        if arg == option and index + 1 < len(args):
            moved.extend(args[index:index + 2])
            index += 2
            continue
        (moved if arg.startswith(option + "=") else rest).append(arg)
        index += 1
    return moved + rest


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


def _run_and_lock(command: Run, params, selected: list[str], tasks: list[str]) -> int:
    """doit's ``run`` of ``tasks``, then the lock file refreshed for ``selected`` and
    what they depend on (also when a task failed: the lock says what is built now)."""
    from .errors import LockfileError
    from .lockfile import read_lock, update_lock

    if params.get("num_process"):
        _parallel_workers(params["num_process"])
    project = _project()
    try:
        # An unreadable lock file stops the command before it builds anything.
        read_lock(project.lock_path)
    except LockfileError as error:
        raise InvalidCommand(str(error)) from None
    result = Run.execute(command, params, tasks)
    try:
        update_lock(project, project.manifest.order(selected))
        project.save_caches()
    except EdgebuildError as error:
        import sys

        print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
        return result or 1
    return result


class Build(Run):
    name = "build"
    doc_purpose = "build artifacts (all, or the ones named) and what they depend on"
    doc_usage = "[--shard I/N] [--dask ADDRESS] [ARTIFACT ...]"
    doc_description = "Rebuilds only what is stale; up-to-date artifacts are skipped. Writes artifacts.lock."
    cmd_options = Run.cmd_options + RUN_OPTIONS  # scale: edgebuild/scale_options.py

    def execute(self, params, args):  # noqa: D102 - doit's signature
        selected = _selected(args, _artifact_names())
        # scale: shards, a cluster, a read-only remote, pull-only (edgebuild/scale_options.py)
        prepared = prepare_scaled(params, selected, verify=False)
        if not prepared.selected:
            return prepared.status
        return _run_and_lock(self, params, prepared.selected, prepared.selected) or prepared.status


class Verify(Run):
    name = "verify"
    doc_purpose = "build what is stale, then verify artifacts (all, or the ones named)"
    doc_usage = "[--shard I/N] [--dask ADDRESS] [ARTIFACT ...]"
    doc_description = (
        "Writes build/<name>/report.json and report.md, and artifacts.lock; exits non-zero if any check fails."
    )
    cmd_options = Run.cmd_options + RUN_OPTIONS  # scale: edgebuild/scale_options.py

    def execute(self, params, args):  # noqa: D102 - doit's signature
        selected = _selected(args, _artifact_names())
        # scale: shards, a cluster, a read-only remote, pull-only (edgebuild/scale_options.py)
        prepared = prepare_scaled(params, selected, verify=True)
        if not prepared.selected:
            return prepared.status
        tasks = [f"verify:{name}" for name in prepared.selected]
        return _run_and_lock(self, params, prepared.selected, tasks) or prepared.status


class Publish(Run):
    name = "publish"
    doc_purpose = "verify artifacts (all, or the ones named), then publish them to DEST"
    doc_usage = "[ARTIFACT ...] --to DEST"
    doc_description = (
        "DEST is a directory or an fsspec URL (file://, s3://bucket/prefix, ...). Each artifact goes to "
        "DEST/<artifact>/<fingerprint>/ with its report, provenance.json and SHA256SUMS; DEST/index.json "
        "lists them. Publishes nothing, and exits non-zero, unless every artifact named verified."
    )
    cmd_options = Run.cmd_options + (
        {"name": "to", "short": "", "long": "to", "type": str, "default": "",
         "help": "where to publish: a directory or an fsspec URL"},
    ) + PUBLISH_OPTIONS  # scale: --remote-readonly, --pull-only (the gather step)

    def parse_execute(self, in_args):  # noqa: D102 - doit's signature
        # doit's parser (getopt) stops at the first artifact name; `doit publish NAME --to DEST`
        # is the natural order, so --to is moved ahead of the names.
        return super().parse_execute(_option_first(list(in_args), "--to"))

    def execute(self, params, args):  # noqa: D102 - doit's signature
        import sys

        from .errors import PublishError
        from .publish import check_publishable, publish

        if not params["to"]:
            raise InvalidCommand("give --to DEST: a directory or an fsspec URL such as s3://bucket/artifacts")
        selected = _selected(args, _artifact_names())
        prepare_scaled(params, selected, verify=True)  # scale: --remote-readonly, --pull-only
        result = _run_and_lock(self, params, selected, [f"verify:{name}" for name in selected])
        try:
            check_publishable(_project(), selected)
            if result != 0:
                raise PublishError("nothing published: a task failed (see above)")
            publish(_project(), selected, params["to"], log=lambda message: print(message, flush=True))
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


def _project():
    from .tasks import load_or_exit

    return load_or_exit()


class Status(Command):
    name = "status"
    doc_purpose = "say which artifacts are up to date, stale (and why) or missing"
    doc_usage = "[ARTIFACT ...]"
    doc_description = "Reads fingerprints only (through the stat cache); builds nothing."
    cmd_options = (
        {"name": "as_json", "short": "", "long": "json", "type": bool, "default": False, "help": "print JSON"},
    )

    def execute(self, params, args):  # noqa: D102 - doit's signature
        import json
        import sys

        from .status import artifact_status

        project = _project()
        selected = _selected(args, list(project.manifest.order()))
        states = [artifact_status(project, name) for name in selected]
        project.save_caches()
        if params["as_json"]:
            print(json.dumps(states, indent=2))
            return 0
        width = max(len(name) for name in selected)
        for state in states:
            line = f"{state['artifact']:<{width}}  {state['state']}"
            if state.get("note"):
                line += f" ({state['note']})"
            print(line)
            for reason in state.get("reasons", []):
                print(f"{'':<{width}}    - {reason}")
        sys.stdout.flush()
        return 0


class Gc(Command):
    name = "gc"
    doc_purpose = "prune the content-addressed store (cache/store) by size and/or age"
    doc_usage = "[--max-size 20G] [--max-age 30d] [--dry-run]"
    doc_description = "The entries of the current builds are always kept."
    cmd_options = (
        {"name": "max_size", "short": "", "long": "max-size", "type": str, "default": "",
         "help": "keep the store under this size (e.g. 500M, 20G)"},
        {"name": "max_age", "short": "", "long": "max-age", "type": str, "default": "",
         "help": "remove entries unused for longer than this (e.g. 12h, 30d)"},
        {"name": "dry_run", "short": "", "long": "dry-run", "type": bool, "default": False,
         "help": "only say what would be removed"},
    )

    def execute(self, params, args):  # noqa: D102 - doit's signature
        from .errors import EdgebuildError

        try:
            max_bytes = parse_size(params["max_size"]) if params["max_size"] else None
            max_age = parse_age(params["max_age"]) if params["max_age"] else None
        except ValueError as error:
            raise InvalidCommand(str(error)) from None
        if max_bytes is None and max_age is None:
            raise InvalidCommand("give --max-size and/or --max-age")
        project = _project()
        keep = set()
        for name in project.manifest.artifacts:
            try:
                keep.add(project.fingerprint(name))
            except EdgebuildError:
                continue
        removed = project.store.gc(max_bytes, max_age, keep, dry_run=params["dry_run"])
        if not params["dry_run"]:
            project.store.remove_leftovers()
        verb = "would remove" if params["dry_run"] else "removed"
        for entry in removed:
            print(f"{verb} {entry.fingerprint[:16]} ({entry.size / 2**20:.1f} MiB)")
        total = sum(entry.size for entry in removed)
        print(f"{verb} {len(removed)} entries, {total / 2**20:.1f} MiB")
        return 0
