"""Each build and each verification in a process of its own.

An export holds the model, its traced graph and onnxruntime's sessions, and the
allocator does not give all of it back: measured on the full-size tower, the doit
process still held 2.2 GiB after a build, and verifying in the same process then
peaked at 5.1 GiB against 3.1 GiB on its own. So the doit action (the parent,
which may go on to run many more tasks) only decides and relays, in every mode
(``-n 1`` too); a worker process loads the project, builds or verifies one
artifact, and exits, handing all of its memory back::

    python -m edgebuild.run.workers build|export|verify MANIFEST ROOT NAME --result-fd FD [--expect FP]

What stays in the parent is what costs no export's memory (the scheduler decides,
``scheduler.py``): an artifact that is up to date, restored from the store or pulled
from the remote cache (file copies and digests), and a verification whose passing
report for the current verification fingerprint came with the build (a shard's or a
cluster worker's), which is kept and pushed without being judged again.

The worker reads its settings from the environment the parent gives it (the
parent's :class:`~edgebuild.core.config.Settings`, written out once at this
boundary), and the fingerprint the parent planned with (``--expect``): a manifest or
input edited while the run was under way makes the worker refuse, rather than build
something other than what was planned.

The worker's stdout and stderr are relayed line by line through the parent's own
``sys.stdout``/``sys.stderr`` (so whatever doit does with a task's output applies
to them too). Its result travels apart from its output, as one JSON object on a
pipe: the values doit keeps for the task, or an edgebuild error as its class and
one-line message, which the parent raises again -- no traceback for a fault the
message explains. A worker killed by a signal (the kernel's OOM killer, a kill
-9), interrupted, lost with its fork server, or ended without a word (``os._exit``) is
reported by artifact name and how it ended, and with what it left behind as the next
command finds it (read from disk then: a worker killed after its build was in place, or
its report written, left that); an unexpected exception (a bug) is reported with the
worker's own traceback above it, and only then is a traceback said to be above.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable

from edgebuild import errors
from edgebuild.core.config import Settings
from edgebuild.errors import EdgebuildError, PlanChanged, WorkerError, WorkerKilled
from edgebuild.run.forkserver import RESULT_FD_PLACEHOLDER, server_for, with_result_fd

if TYPE_CHECKING:
    from edgebuild.core.kind import ArtifactKind
    from edgebuild.core.project import Artifact
    from edgebuild.run.workspace import Workspace

MODES = ("build", "export", "verify")
# How long a worker that was asked to stop (Ctrl-C) gets to clean up its scratch
# directory before it is killed.
INTERRUPT_GRACE_SECONDS = 10.0
# Exit status of a worker that stopped on SIGINT after cleaning up (128 + SIGINT, as a shell says).
INTERRUPTED_STATUS = 128 + signal.SIGINT

Relay = Callable[[str, str], None]


def step_word(mode: str) -> str:
    """What a user reads for ``mode``: an export is a build ("the build process was killed")."""
    return "build" if mode == "export" else mode


# --- the parent ---------------------------------------------------------------------------


def run_step(mode: str, workspace: "Workspace", artifact: "Artifact", log: Callable[[str], None],
             relay: Relay | None = None) -> dict[str, Any]:
    """Do ``mode`` for ``artifact`` where its kind's steps run: in a worker process of its
    own (:func:`run_worker`), or, for a kind that declares ``in_process`` (its steps load
    no model: a worker's start would cost more than the step), in this process. Same
    values, same edgebuild errors either way; an unexpected exception in the kind's code
    is its traceback on stderr and one :class:`WorkerError` line, as a worker's is."""
    if not artifact.kind.process.in_process:
        return run_worker(mode, workspace, artifact, relay)
    try:
        return step(mode, workspace, artifact, log)
    except EdgebuildError:
        raise
    except Exception as error:  # noqa: BLE001 - a bug in the kind's code: its traceback is the report
        import traceback

        traceback.print_exc(file=sys.stderr)
        raise WorkerError(f"{artifact.name}: the {artifact.kind.name} {step_word(mode)} raised {type(error).__name__} in this "
                          "process (the kind runs in_process; its traceback is above)") from None


def run_worker(mode: str, workspace: "Workspace", artifact: "Artifact", relay: Relay | None = None,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``mode`` for ``artifact`` in a worker process and return its values; raise its
    edgebuild error again (same class, same one line), or :class:`WorkerError` naming
    the artifact when it crashed. ``relay(stream, line)`` receives its output (default:
    this process's ``sys.stdout``/``sys.stderr``)."""
    return run_worker_at(mode, str(workspace.manifest.path), str(workspace.layout.root), artifact.name,
                         workspace.worker_environment(env), relay, expect=artifact.fingerprint,
                         imports=worker_imports(artifact.kind, mode), warmups=worker_warmups(artifact.kind, mode))


def worker_imports(kind: "ArtifactKind", mode: str) -> tuple[str, ...]:
    """What the fork server imports before it forks a ``mode`` worker of ``kind``: its
    ``worker_imports``, and for a build (or export) its ``build_imports`` too."""
    return kind.process.worker_imports + (kind.process.build_imports if step_word(mode) == "build" else ())


def worker_warmups(kind: "ArtifactKind", mode: str) -> tuple[str, ...]:
    """What the fork server imports just after it forks a ``mode`` worker of ``kind``:
    its ``build_warmups`` for a build (or export)."""
    return kind.process.build_warmups if step_word(mode) == "build" else ()


def start_server_early(workspace: "Workspace", processes: int = 1) -> bool:
    """Start the fork server this workspace's workers will fork from now, in the
    background (it imports torch and onnxruntime, seconds, while this process plans);
    return whether one was started. Not where workers start as fresh interpreters, nor
    for a server of this command's own when doit runs the tasks in ``processes`` > 1
    processes of their own: each would start its own server, not fork from this one's."""
    from edgebuild.core.config import fork_server_mode
    from edgebuild.run.forkserver import start_in_background

    environment = _process_environment(workspace.worker_environment())
    mode = fork_server_mode(environment)
    if mode == "off" or (mode == "process" and processes > 1):
        return False
    start_in_background(environment)
    return True


def run_worker_at(
    mode: str,
    manifest_path: str,
    root: str,
    name: str,
    env: dict[str, str] | None = None,
    relay: Relay | None = None,
    expect: str | None = None,
    imports: tuple[str, ...] = (),
    warmups: tuple[str, ...] = (),
) -> dict[str, Any]:
    """:func:`run_worker` by manifest path and root, in the environment ``env`` (which
    holds the settings; default: this process's); ``expect``: the fingerprint the
    caller planned with; ``imports`` and ``warmups``: what the fork server imports
    before and after it forks this worker (:func:`worker_imports`, :func:`worker_warmups`)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    relay = relay or _relay_to_own_streams
    environment = dict(os.environ) if env is None else env
    if not Settings.from_environ(environment).verbose:
        relay = _without_library_noise(relay)
    relay = _said_once_per_command(relay)
    reader, writer = os.pipe()
    arguments = [mode, manifest_path, root, name, "--result-fd", RESULT_FD_PLACEHOLDER]
    if expect:
        arguments += ["--expect", expect]
    environment = _process_environment(environment)
    server = server_for(environment)
    process: Any = None
    if server is not None:
        try:
            process = server.fork(arguments, environment, writer, imports, warmups)
        except OSError:
            process = None  # a fresh interpreter instead
    try:
        if process is None:
            command = [sys.executable, "-m", "edgebuild.run.workers", *with_result_fd(arguments, writer)]
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                       env=environment, pass_fds=(writer,))
    except OSError as error:
        os.close(reader)
        os.close(writer)
        raise WorkerError(f"{name}: cannot start a {step_word(mode)} process ({error.strerror or error})") from None
    os.close(writer)
    seen: set[str] = set()
    relays = [
        threading.Thread(target=_copy_lines, args=(process.stdout, "stdout", relay, seen), daemon=True),
        threading.Thread(target=_copy_lines, args=(process.stderr, "stderr", relay, seen), daemon=True),
    ]
    for thread in relays:
        thread.start()
    try:
        with os.fdopen(reader, "rb") as result_pipe:
            # Read to the end while the worker runs: EOF comes when it exits (or dies).
            raw = result_pipe.read()
        status = process.wait()
    except KeyboardInterrupt:
        _stop(process)
        raise
    for thread in relays:
        thread.join(timeout=5)
    try:
        return _outcome(step_word(mode), name, process.pid, status, raw, traceback=TRACEBACK in seen,
                        server_lost=getattr(process, "server_lost", False))
    except WorkerCrash as crash:
        # Said only now, from what is on disk: a worker that ended after putting its build
        # in place, or after writing a passing report, left exactly that behind. Killed (a
        # signal, its server gone) is told apart from a worker that failed on its own.
        killed = status < 0 or getattr(process, "server_lost", False)
        raise (WorkerKilled if killed else WorkerError)(
            f"{crash}; {_left_behind(mode, manifest_path, root, name, environment)}") from None


def _process_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this edgebuild first on the path -- the worker must run the code whose
    digest the fingerprint holds, not another installed copy -- and unbuffered output,
    for a live relay."""
    environment = dict(env)
    package_parent = str(Path(__file__).resolve().parents[2])
    path = [part for part in environment.get("PYTHONPATH", "").split(os.pathsep) if part and part != package_parent]
    environment["PYTHONPATH"] = os.pathsep.join([package_parent, *path])
    environment["PYTHONUNBUFFERED"] = "1"
    return environment

def _without_library_noise(relay: Relay) -> Relay:
    """``relay``, minus what native libraries print past Python's logging (see
    ``edgebuild/core/console.py``): shown only with the ``verbose`` setting."""
    from edgebuild.core.console import is_library_noise

    def filtered(stream: str, line: str) -> None:
        if not is_library_noise(line):
            relay(stream, line)

    return filtered


def _said_once_per_command(relay: Relay) -> Relay:
    """``relay``, minus a line this process said once already (``console.say_once``: the
    stat cache that cannot be written), which each worker's own stat cache says again."""
    from edgebuild.core.console import relayed_once

    def filtered(stream: str, line: str) -> None:
        if stream != "stderr" or relayed_once(line):
            relay(stream, line)

    return filtered


def _relay_to_own_streams(stream: str, line: str) -> None:
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write(line)
    target.flush()


# How Python starts a traceback on stderr: seen in a worker's output, its failure is a bug
# whose traceback is above; not seen, the worker ended some other way.
TRACEBACK = "Traceback (most recent call last):"


def _copy_lines(pipe: IO[bytes], stream: str, relay: Relay, seen: set[str]) -> None:
    with pipe:
        for line in iter(pipe.readline, b""):
            text = line.decode("utf-8", errors="replace")
            if stream == "stderr" and text.startswith(TRACEBACK):
                seen.add(TRACEBACK)
            relay(stream, text)


def _stop(process: subprocess.Popen) -> None:
    """Ctrl-C reached this process (and, from a terminal, the worker too): give the
    worker time to remove its scratch directory, then kill it."""
    try:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=INTERRUPT_GRACE_SECONDS)
    except (subprocess.TimeoutExpired, OSError):
        process.kill()
        process.wait()


class WorkerCrash(Exception):
    """A worker that ended without handing back a result or an error: how it ended, to
    which the caller adds what it left behind."""


def _outcome(mode: str, name: str, pid: int, status: int, raw: bytes, traceback: bool = False,
             server_lost: bool = False) -> dict[str, Any]:
    try:
        result = json.loads(raw) if raw.strip() else None
    except ValueError:
        result = None
    if status == 0 and isinstance(result, dict) and isinstance(result.get("values"), dict):
        return result["values"]
    if isinstance(result, dict) and isinstance(result.get("error"), str):
        raise _edgebuild_error(result.get("type"), result["error"])
    process = f"{name}: the {mode} process (pid {pid})"
    if server_lost:
        raise WorkerCrash(f"{process} ended with the fork server it was forked from (the server was stopped or killed "
                          "before the worker ended; a shared one by another command, or by hand)")
    if status < 0:
        raise WorkerCrash(f"{process} was killed by {_signal_name(-status)}{_signal_hint(-status)}")
    if status == INTERRUPTED_STATUS or (isinstance(result, dict) and result.get("interrupted")):
        raise WorkerCrash(f"{process} was interrupted (SIGINT)")
    if status == 0:
        raise WorkerCrash(f"{process} exited with status 0 without handing back its result (code it ran ended the "
                          "process: os._exit?)")
    if traceback:
        raise WorkerCrash(f"{process} failed with exit status {status} (its traceback is above)")
    raise WorkerCrash(f"{process} failed with exit status {status}, with no traceback (code it ran ended the process: "
                      "os._exit, or a native library's crash)")


def _left_behind(mode: str, manifest_path: str, root: str, name: str, env: dict[str, str]) -> str:
    """What a worker that ended without a result left, as the next command will find it:
    nothing that counts, a complete build put in place, or a report written."""
    from edgebuild.core.config import Settings
    from edgebuild.run.state import VerificationState, is_built, verification_state
    from edgebuild.run.workspace import Workspace

    try:
        workspace = Workspace.open(manifest_path, Path(root), Settings.from_environ(env))
        artifact = workspace.artifact(name)
        if mode != "verify":
            if is_built(workspace, artifact):
                return (f"build/{name} was complete and in place before it ended: {name} is up to date (not "
                        "verified), as `doit status` says")
            return "nothing of it counts as built"
        state = verification_state(workspace, artifact)
    except Exception:  # noqa: BLE001 - a manifest broken meanwhile, a disk gone: say where to look
        return f"what it left: `doit status {name}` says"
    if state is VerificationState.VERIFIED:
        return (f"its report was complete and passed before it ended: {name} is verified, and kept in the store "
                "and pushed by the run that started it")
    if state is VerificationState.FAILED:
        return f"its report was complete before it ended: {name}'s verification FAILED (see build/{name}/report.md)"
    return "nothing of it counts as verified"


def _edgebuild_error(type_name: Any, message: str) -> EdgebuildError:
    """The worker's error as the same class here, when it is one of edgebuild's."""
    cls = getattr(errors, type_name, None) if isinstance(type_name, str) else None
    if isinstance(cls, type) and issubclass(cls, EdgebuildError):
        try:
            return cls(message)
        except TypeError:
            pass
    return WorkerError(message)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _signal_hint(number: int) -> str:
    if number == signal.SIGKILL:
        return " (out of memory? the kernel's OOM killer sends SIGKILL)"
    return ""


# --- the worker process ------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgebuild.run.workers", description="Build or verify one artifact.")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("manifest")
    parser.add_argument("root")
    parser.add_argument("name")
    parser.add_argument("--result-fd", type=int, default=None, help="where the JSON result goes (default: stdout)")
    parser.add_argument("--expect", default=None, help="the fingerprint the caller planned with")
    args = parser.parse_args(argv)
    # Ctrl-C stops a build whatever the parent inherited (``cmd &`` starts with SIGINT
    # ignored): the scratch directory is removed on the way out, nothing counts as built.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _exit_with_parent()
    result: dict[str, Any]
    status = 0
    try:
        result = {"values": _work(args.mode, args.manifest, Path(args.root), args.name, args.expect)}
    except EdgebuildError as error:
        result = {"error": str(error), "type": type(error).__name__}
        status = 1
    except KeyboardInterrupt:
        # The cleanup (``finally`` blocks, context managers) has run on the way here.
        result = {"interrupted": True}
        status = INTERRUPTED_STATUS
    except SystemExit as ended:
        # A kind's code called sys.exit: not a result, whatever the code. The cleanup ran.
        said = step_word(args.mode)
        result = {"error": f"{args.name}: the {said} code called sys.exit({ended.code!r}) instead of returning; "
                           f"nothing of this {said} was kept", "type": "WorkerError"}
        status = 1
    except Exception as error:
        # Out of memory is the environment, not a bug: one line, however deep in torch or
        # an import it struck. Anything else is a bug, and its traceback is the report.
        if not _out_of_memory(error):
            raise
        result = {"error": _out_of_memory_message(step_word(args.mode), args.name), "type": "WorkerError"}
        status = 1
    from edgebuild.core.timing import peak_rss_bytes

    result["peak_rss_bytes"] = peak_rss_bytes()
    _write_result(args.result_fd, result)
    return status


def _work(mode: str, manifest_path: str, root: Path, name: str, expect: str | None) -> dict[str, Any]:
    from edgebuild.core.config import Settings
    from edgebuild.core.console import quiet_libraries
    from edgebuild.run.builder import materialise, stderr_log
    from edgebuild.run.workspace import Workspace

    settings = Settings.from_environ()
    share_cores(settings.jobs)
    quiet_libraries(settings.verbose)
    workspace = Workspace.open(manifest_path, root, settings)
    artifact = workspace.artifact(name)
    # And the libraries its kind runs, before its step imports them.
    quiet_libraries(settings.verbose, artifact.kind.process.quiet_loggers)
    try:
        if mode == "build":
            # A cluster job's whole route: sources first, from what is there (pulled: they
            # pushed theirs before this task was handed out), then the artifact itself from
            # the caches, or exported.
            for source in workspace.order(artifact.sources):
                if materialise(workspace, source, stderr_log(source.name)) is None:
                    raise WorkerError(
                        f"{name}: its source {source.name} is neither built in {root}, in the store nor in the remote "
                        "cache; build it first (a cluster task runs only after its sources pushed theirs)"
                    )
        _refuse_another_plan(artifact, expect)
        values = step(mode, workspace, artifact, stderr_log(name))
    except BaseException:
        # What was hashed stays hashed; the error that stopped the work is the story.
        try:
            workspace.save_caches()
        except EdgebuildError:
            pass
        raise
    workspace.save_caches()
    return values


def step(mode: str, workspace: "Workspace", artifact: "Artifact", log: Callable[[str], None]) -> dict[str, Any]:
    """Do ``mode`` for ``artifact`` in this process and return the values the caller
    keeps: ``export`` (the caller found it nowhere: the caches are not asked again, see
    :func:`~edgebuild.run.builder.export`), ``build`` (a cluster job's: from the caches
    or exported), ``verify`` (judged, kept, pushed)."""
    from edgebuild.run.builder import export, make_current, materialise, refused_export, verify_artifact

    if mode == "verify":
        verify_artifact(workspace, artifact, log)
        return {"verify_fingerprint": artifact.verify_fingerprint}
    if mode == "export":
        return {"fingerprint": export(workspace, artifact, log).fingerprint}
    if workspace.settings.pull_only:
        record = materialise(workspace, artifact, log)
        if record is None:
            raise refused_export(workspace, artifact)
        return {"fingerprint": record.fingerprint}
    return {"fingerprint": make_current(workspace, artifact, log).fingerprint}


def _refuse_another_plan(artifact: "Artifact", expect: str | None) -> None:
    """The caller planned this artifact at fingerprint ``expect``: a manifest, input or code
    edited since would make this process build something else under the same name."""
    if expect and artifact.fingerprint != expect:
        raise PlanChanged(
            f"{artifact.name}: its fingerprint changed since this run planned it ({expect[:12]} -> "
            f"{artifact.fingerprint[:12]}): the manifest, an input or the code was edited meanwhile; "
            "nothing was built, run the command again"
        )


def share_cores(jobs: int) -> None:
    """Under ``doit build -n N`` (the ``jobs`` setting), give torch cores / N threads: N
    processes each spinning up a thread per core leave OpenMP threads waiting on
    each other, which slows small ops by orders of magnitude."""
    if jobs > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // jobs))


def _exit_with_parent() -> None:
    """Stop when the parent goes (doit killed, a cluster worker lost): a build nobody
    waits for only holds memory and cores. Nothing is lost -- a build that never
    renamed its scratch directory into place does not count as built."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(INTERRUPTED_STATUS)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


# How the C library says an allocation or a mapping failed (an ``import torch`` under
# ``ulimit -v`` is an ImportError "failed to map segment from shared object").
_NO_MEMORY_TEXT = ("Cannot allocate memory", "failed to map segment", "std::bad_alloc", "out of memory")


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or any error it was raised from or during, is running out of memory."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or (isinstance(current, OSError) and current.errno == errno.ENOMEM):
            return True
        if isinstance(current, (ImportError, OSError, RuntimeError)) and any(text in str(current) for text in _NO_MEMORY_TEXT):
            return True
        current = current.__cause__ or current.__context__
    return False


def _out_of_memory_message(mode: str, name: str) -> str:
    from edgebuild.core.timing import peak_rss_bytes

    limit = memory_limit()
    peak = peak_rss_bytes()
    peak_text = f" at a peak of {peak / 2**30:.2f} GiB resident" if peak else ""
    return (f"{name}: the {mode} process ran out of memory{peak_text} ({limit or 'no limit of its own: the machine'}); "
            f"raise the limit, or {mode} it on a machine with more memory")


def memory_limit() -> str | None:
    """The memory limit this process runs under, in words: an address-space rlimit
    (``ulimit -v``) or a cgroup's ``memory.max``; ``None`` when there is neither."""
    import resource

    from edgebuild.core.files import SMALL_BYTES, UnreadableFile, read_text

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        return f"an address-space limit of {soft / 2**30:.2f} GiB, ulimit -v"
    try:
        text = read_text(Path("/sys/fs/cgroup/memory.max"), SMALL_BYTES).strip()
    except (OSError, UnreadableFile):
        return None
    if text.isdigit():
        return f"a cgroup memory limit of {int(text) / 2**30:.2f} GiB"
    return None


def _write_result(descriptor: int | None, result: dict[str, Any]) -> None:
    payload = (json.dumps(result) + "\n").encode()
    if descriptor is None:
        sys.stdout.buffer.write(payload)
        sys.stdout.flush()
        return
    try:
        with os.fdopen(descriptor, "wb") as pipe:
            pipe.write(payload)
    except BrokenPipeError:
        # The command that asked is gone (Ctrl-C, a kill): no one to tell, nothing to say.
        pass


if __name__ == "__main__":
    raise SystemExit(main())
