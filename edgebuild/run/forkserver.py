"""Worker processes forked from an interpreter that has imported the heavy libraries.

A worker started as a fresh interpreter spends ~2.4 s importing torch, transformers and
onnxruntime before it does anything: every build and every verification paid it. So
the first worker a process needs starts a *fork server* -- ``python -m
edgebuild.run.forkserver``, which imports those libraries once and then waits -- and
every worker after that is a ``fork()`` of it: a process of its own all the same, with
its own memory (handed back when it exits), its own pid, its own exit status, killed
alone by a signal or the OOM killer, and nothing of one worker seen by the next.

Fork safety: the server only imports, it runs no torch op, session or thread pool, so
it is single-threaded when it forks (what ``multiprocessing``'s forkserver relies on
too). numba is not imported there: it reads ``NUMBA_CACHE_DIR`` at import, and that is
a project's setting.

The protocol, over a Unix socket (``SOCK_SEQPACKET``: one request, one message): the
parent sends the worker's argv and environment with four descriptors -- the write ends
of its stdout, stderr and result pipes, and a status socket; the server forks, the
child makes those its fds 1, 2 and the result fd, takes the environment as its own and
runs ``edgebuild.run.workers.main``; the server answers the child's pid on the status
socket at once and its exit status (negative for a signal, as ``Popen`` says) when it
ends. A worker whose environment differs from a server's in anything but edgebuild's
own settings (a library may read a variable at import) gets a server of its own
(a process keeps the last :data:`MAX_SERVERS`). A server that does not come up (an
import that fails under a memory limit, say) is not retried, and one that died is not
restarted: workers then start as fresh interpreters, as before; so does every worker
when ``EDGEBUILD_FORK_SERVER=0``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

WORKER_MODULE = "edgebuild.run.workers"
# What a worker imports before it can build or verify anything (not numba: see above).
PRELOAD = ("torch", "transformers", "onnxruntime", "onnx", "safetensors", WORKER_MODULE, "edgebuild.run.workspace")
# How long the server may take to import PRELOAD before workers start without it.
START_TIMEOUT_SECONDS = 120.0
MESSAGE_BYTES = 4 << 20
RESULT_FD_PLACEHOLDER = "{result_fd}"


# Variables that change while a process runs and that no library reads at import:
# pytest names the running test in one.
_VOLATILE = ("PYTEST_CURRENT_TEST",)


def with_result_fd(argv: list[str], descriptor: int) -> list[str]:
    """``argv`` with :data:`RESULT_FD_PLACEHOLDER` replaced by ``descriptor``."""
    return [str(descriptor) if part == RESULT_FD_PLACEHOLDER else part for part in argv]


def _comparable(env: dict[str, str]) -> dict[str, str]:
    """What of an environment a library may have read at import: all but edgebuild's own
    settings (each worker reads its own) and what changes by itself."""
    return {key: value for key, value in env.items() if not key.startswith("EDGEBUILD_") and key not in _VOLATILE}


class ForkedWorker:
    """A worker forked by the server, with the parts of :class:`subprocess.Popen` that
    ``workers.run_worker_at`` uses: ``pid``, ``stdout``, ``stderr``, ``wait``,
    ``send_signal``, ``kill``."""

    def __init__(self, pid: int, stdout: IO[bytes], stderr: IO[bytes], status: socket.socket) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self._status = status
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._status.settimeout(timeout)
            try:
                data = self._status.recv(64)
            except socket.timeout:
                raise subprocess.TimeoutExpired("forked worker", timeout) from None
            finally:
                self._status.settimeout(None)
            # No answer at all: the server is gone, and the worker with it (it exits with
            # its parent): report it as killed.
            self.returncode = int(data) if data.strip() else -signal.SIGKILL
            self._status.close()
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The parent's side: starts the server, then forks workers through it."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.environment = dict(environment)
        parent_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._socket = parent_end
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgebuild.run.forkserver", str(server_end.fileno())],
            env=self.environment, pass_fds=(server_end.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        server_end.close()
        ready, _, _ = select.select([parent_end], [], [], START_TIMEOUT_SECONDS)
        answer = parent_end.recv(64) if ready else b""
        if answer != b"ready":
            self.close()
            raise OSError("the fork server did not start")

    def fork(self, argv: list[str], environment: dict[str, str], result_writer: int,
             imports: tuple[str, ...] = ()) -> ForkedWorker:
        """Fork a worker running ``edgebuild.run.workers.main(argv)`` in ``environment``;
        ``result_writer`` becomes its result fd (named in ``argv`` by the placeholder).
        The server imports ``imports`` first (once each), so this worker and every later
        one start with them (a kind's ``worker_imports``)."""
        stdout_reader, stdout_writer = os.pipe()
        stderr_reader, stderr_writer = os.pipe()
        status_parent, status_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        message = json.dumps({"argv": argv, "env": environment, "imports": list(imports)}).encode()
        try:
            with self._lock:
                socket.send_fds(self._socket, [message],
                                [stdout_writer, stderr_writer, result_writer, status_child.fileno()])
        finally:
            for descriptor in (stdout_writer, stderr_writer):
                os.close(descriptor)
            status_child.close()
        line = b""
        while not line.endswith(b"\n"):
            chunk = status_parent.recv(1)
            if not chunk:
                break
            line += chunk
        if not line.strip().isdigit():
            os.close(stdout_reader)
            os.close(stderr_reader)
            status_parent.close()
            raise OSError("the fork server did not fork the worker")
        return ForkedWorker(int(line), os.fdopen(stdout_reader, "rb"), os.fdopen(stderr_reader, "rb"), status_parent)

    def close(self) -> None:
        try:
            self._socket.close()
        finally:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()


# A process normally runs every worker in one environment, so it has one server; one
# that runs them in several (the test suite, an API user with per-project variables)
# keeps the servers of the last few, each holding the libraries' memory.
MAX_SERVERS = 2
# Comparable environment (as JSON) -> its server, or None when it would not start.
_SERVERS: "dict[str, ForkServer | None]" = {}
_SERVERS_LOCK = threading.Lock()


def server_for(environment: dict[str, str]) -> ForkServer | None:
    """The fork server for workers in ``environment``, started on first use; ``None`` when
    workers start as fresh interpreters instead (switched off, or it would not start)."""
    from edgebuild.core.config import fork_server_enabled

    if not fork_server_enabled(environment):
        return None
    key = json.dumps(_comparable(environment), sort_keys=True)
    with _SERVERS_LOCK:
        if key in _SERVERS:
            server = _SERVERS.pop(key)  # and back at the end: the most recently used
            if server is not None and server.process.poll() is not None:
                server = None  # it died: workers go on as fresh interpreters
        else:
            try:
                server = ForkServer(environment)
            except OSError:
                server = None
            else:
                import atexit

                atexit.register(server.close)
        _SERVERS[key] = server
        while len(_SERVERS) > MAX_SERVERS:
            oldest = _SERVERS.pop(next(iter(_SERVERS)))
            if oldest is not None:
                oldest.close()
    return server


# --- the server ---------------------------------------------------------------------------


def serve(descriptor: int) -> None:
    connection = socket.socket(fileno=descriptor)
    # Ctrl-C reaches the whole process group: the workers clean up and stop on it (their
    # main() takes SIGINT again); the server waits for them, and goes with its parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in PRELOAD:
        __import__(module)
    connection.send(b"ready")
    children: dict[int, socket.socket] = {}
    parent = os.getppid()
    while True:
        ready, _, _ = select.select([connection], [], [], 0.2)
        if ready:
            try:
                message, descriptors, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, 4)
            except OSError:
                message, descriptors = b"", []
            if not message:
                break  # the parent is gone
            request = json.loads(message)
            stdout_writer, stderr_writer, result_writer, status = descriptors
            _import_quietly(request.get("imports", ()))
            pid = os.fork()
            if pid == 0:
                connection.close()
                for other in children.values():
                    other.close()
                os.close(status)
                _run_child(request, stdout_writer, stderr_writer, result_writer)
            for own in (stdout_writer, stderr_writer, result_writer):
                os.close(own)
            status_socket = socket.socket(fileno=status)
            status_socket.sendall(f"{pid}\n".encode())
            children[pid] = status_socket
        _reap(children)
        if os.getppid() != parent:
            break
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.05)


def _import_quietly(modules: "list[str] | tuple[str, ...]") -> None:
    """Import what a kind's workers import, once each. One that fails (a plugin's missing
    library, a private module gone in another torch) is left to the worker, which
    imports it itself and reports what it finds; what it printed is dropped here (the
    server's own streams go nowhere)."""
    for module in modules:
        if module in sys.modules or module in _FAILED_IMPORTS:
            continue
        try:
            __import__(module)
        except Exception:
            _FAILED_IMPORTS.add(module)


_FAILED_IMPORTS: set[str] = set()


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        status_socket = children.pop(pid, None)
        if status_socket is not None:
            try:
                status_socket.sendall(str(os.waitstatus_to_exitcode(status)).encode())
            except OSError:
                pass
            status_socket.close()


def _run_child(request: dict[str, Any], stdout_writer: int, stderr_writer: int, result_writer: int) -> None:
    """In the forked worker: its own fds, environment and signals, then the worker's main."""
    code = 1
    try:
        os.dup2(stdout_writer, 1)
        os.dup2(stderr_writer, 2)
        os.close(stdout_writer)
        os.close(stderr_writer)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        argv = with_result_fd(request["argv"], result_writer)
        # What `python -m edgebuild.run.workers ARGV` runs, by name as `-m` does: the
        # module (imported already, PRELOAD) calls this one, never the other way round.
        import importlib

        sys.argv = [WORKER_MODULE, *argv]
        code = importlib.import_module(WORKER_MODULE).main(argv)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
