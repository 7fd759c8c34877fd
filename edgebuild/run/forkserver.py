"""Worker processes forked from an interpreter that has imported the heavy libraries.

A worker started as a fresh interpreter spends ~2.4 s importing torch, transformers and
onnxruntime before it does anything: every build and every verification paid it. So
the first worker a process needs starts a *fork server* -- ``python -m
edgebuild.run.forkserver``, which imports those libraries once and then waits -- and
every worker after that is a ``fork()`` of it: a process of its own all the same, with
its own memory (handed back when it exits), its own pid, its own exit status, killed
alone by a signal or the OOM killer, and nothing of one worker seen by the next.

Fork safety: the server imports, and a kind's ``build_imports`` and ``build_warmups``
may run torch on import (they make what builds keep: a delegate's pattern graphs, a
warm ONNX exporter); it runs them on one torch thread and starts no session or thread
pool, so it is single-threaded when it forks (what ``multiprocessing``'s forkserver
relies on too). numba is not imported there: it reads ``NUMBA_CACHE_DIR`` at import,
and that is a project's setting.

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

By default (``EDGEBUILD_FORK_SERVER=shared``; ``process`` is the default where ``CI`` is
set: see :func:`edgebuild.core.config.fork_server_mode`) the server outlives the
command, as Gradle's daemon and Bazel's server do: the next ``doit`` of this user, in
the same comparable environment, forks from it instead of paying the imports again. It listens on a Unix socket
(mode 0600) in a directory of the user's own (mode 0700, refused otherwise), named by a
digest of the user's uid, the interpreter, the comparable environment, the resource
limits, cgroup and niceness (:func:`_shared_key`); a client refuses a socket of another
user's, or one another user's server listens on (the kernel's ``SO_PEERCRED``), and
forks from a server of its own instead; it runs in a
session of its own (a terminal's Ctrl-C does not reach it); it sends a worker SIGINT,
then SIGKILL, when the process that asked for it is gone (its status socket closed);
it retires when a module file it imported changes on disk (an edited plugin, an
upgraded library: workers would run the old code), when its socket is removed, or
after ``EDGEBUILD_FORK_SERVER_IDLE`` seconds with no client (default 300).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator

WORKER_MODULE = "edgebuild.run.workers"
# What a worker imports before it can build or verify anything (not numba: see above).
# Not transformers: the kinds that use it name its modules in their ``worker_imports``,
# and a job that does not (quantizing a graph: onnxruntime's QNN recipe imports torch
# itself) is spared its import, 1 to 4 s.
PRELOAD = ("torch", "onnxruntime", "onnx", "safetensors", WORKER_MODULE, "edgebuild.run.workspace")
# How long the server may take to import PRELOAD before workers start without it.
START_TIMEOUT_SECONDS = 120.0
MESSAGE_BYTES = 4 << 20
RESULT_FD_PLACEHOLDER = "{result_fd}"


# Variables that change while a process runs and that no library reads at import:
# pytest names the running test in one; torch writes its compile cache's default
# directory into TORCHINDUCTOR_CACHE_DIR the first time it uses that cache (in the doit
# process: generating a fixture), and reads it only then. Counting that one made the
# command after a fixture's generation start a second server beside the first one.
_VOLATILE = ("PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID",
             "TORCHINDUCTOR_CACHE_DIR")


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
        self.server_lost = False

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
            # its parent). Not the worker's own death: ``server_lost`` says so, for the
            # message (a SIGKILL would read as the OOM killer's).
            self.server_lost = not data.strip()
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


class StaleServer(OSError):
    """A shared server refused to fork: a module it imported has changed on disk."""


class AnotherUsersServer(OSError):
    """A shared server's socket that is not this user's (its file, or the process listening
    on it): never talked to, since a worker forked there would run as that user, with
    this user's command line and environment in its hands."""


class _Client:
    """What a process asks of a server over its connection: forks."""

    _socket: socket.socket
    _lock: threading.Lock

    def fork(self, argv: list[str], environment: dict[str, str], result_writer: int,
             imports: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> ForkedWorker:
        """Fork a worker running ``edgebuild.run.workers.main(argv)`` in ``environment``;
        ``result_writer`` becomes its result fd (named in ``argv`` by the placeholder).
        The server imports ``imports`` first (once each), so this worker and every later
        one start with them (a kind's ``worker_imports``); and ``after`` once it has forked
        it, so that only later ones do (a kind's ``build_warmups``)."""
        stdout_reader, stdout_writer = os.pipe()
        stderr_reader, stderr_writer = os.pipe()
        status_parent, status_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        message = json.dumps({"argv": argv, "env": environment, "imports": list(imports), "after": list(after),
                              "cwd": os.getcwd(), "umask": _umask()}).encode()
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
            if line.strip() == b"stale":
                raise StaleServer("the shared fork server imported code that has changed since")
            raise OSError("the fork server did not fork the worker")
        return ForkedWorker(int(line), os.fdopen(stdout_reader, "rb"), os.fdopen(stderr_reader, "rb"), status_parent)


class ForkServer(_Client):
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

    def alive(self) -> bool:
        return self.process.poll() is None

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


class SharedForkServer(_Client):
    """A client of this user's shared server for ``environment``: connects to it, or
    starts it (one process at a time, under a lock) when there is none."""

    def __init__(self, environment: dict[str, str], directory: Path, idle_seconds: float) -> None:
        self.environment = dict(environment)
        self._lock = threading.Lock()
        self.path = directory / f"{_shared_key(environment)}.sock"
        self._lock_path = self.path.with_suffix(".lock")
        self._idle_seconds = idle_seconds
        # Whether this client started the server (rather than finding one running).
        self.started = False
        self._socket = self._connect_or_start()

    def _connect(self) -> socket.socket | None:
        """A connection to this user's server; ``None`` where none listens.
        :class:`AnotherUsersServer` where the socket, or the server on it, is another user's."""
        import stat

        try:
            status = self.path.lstat()
        except OSError:
            return None
        if not stat.S_ISSOCK(status.st_mode) or status.st_uid != os.getuid():
            raise AnotherUsersServer(f"{self.path}: not a socket of this user's (uid {os.getuid()})")
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(str(self.path))
        except OSError:
            connection.close()
            return None
        server_uid = _peer_uid(connection)
        if server_uid is not None and server_uid != os.getuid():
            connection.close()
            raise AnotherUsersServer(f"{self.path}: the fork server listening there runs as uid {server_uid}, "
                                     f"not this user's {os.getuid()}")
        return connection

    def _connect_or_start(self) -> socket.socket:
        import fcntl

        connection = self._connect()
        if connection is not None:
            return connection
        from edgebuild.core.files import open_lock

        with open_lock(self._lock_path) as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            connection = self._connect()  # another process started it while this one waited
            if connection is not None:
                return connection
            self.path.unlink(missing_ok=True)  # a server that is gone left it behind
            reader, writer = os.pipe()
            try:
                subprocess.Popen(
                    [sys.executable, "-m", "edgebuild.run.forkserver", "--shared", str(self.path),
                     str(self._idle_seconds), str(writer)],
                    env=self.environment, pass_fds=(writer,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True, cwd="/",
                )
            finally:
                os.close(writer)
            with os.fdopen(reader, "rb") as ready_pipe:
                ready, _, _ = select.select([ready_pipe], [], [], START_TIMEOUT_SECONDS)
                answer = ready_pipe.read(5) if ready else b""
            connection = self._connect() if answer == b"ready" else None
        if connection is None:
            raise OSError("the shared fork server did not start")
        self.started = True
        return connection

    def fork(self, argv: list[str], environment: dict[str, str], result_writer: int,
             imports: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> ForkedWorker:
        try:
            return super().fork(argv, environment, result_writer, imports, after)
        except StaleServer:
            # It has retired (and removed its socket): a new one imports the code as it is now.
            with self._lock:
                self._socket.close()
                self._socket = self._connect_or_start()
            return super().fork(argv, environment, result_writer, imports, after)

    def alive(self) -> bool:
        # The server never sends on the connection: readable means it closed (it is gone).
        readable, _, _ = select.select([self._socket], [], [], 0)
        return not readable

    def close(self) -> None:
        self._socket.close()  # the server lives on for the next process, until it idles out


def _peer_uid(connection: socket.socket) -> int | None:
    """The uid of the process at the other end of ``connection`` (the one that listened),
    as the kernel says it; ``None`` where it cannot say (not Linux)."""
    import struct

    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    credentials = connection.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    return struct.unpack("3i", credentials)[1]


def shared_directory(environ: "dict[str, str] | os._Environ[str]") -> Path | None:
    """The directory of this user's shared servers' sockets (made with mode 0700); ``None``
    when it is not this user's alone: another user could then connect and have code
    run as this one."""
    from edgebuild.core.config import FORK_SERVER_DIR_VARIABLE

    configured = environ.get(FORK_SERVER_DIR_VARIABLE, "").strip()
    if configured:
        directory = Path(configured)
    else:
        runtime = environ.get("XDG_RUNTIME_DIR", "").strip()
        import tempfile

        base = Path(runtime) if runtime and os.path.isdir(runtime) else Path(tempfile.gettempdir())
        directory = base / f"edgebuild-forkservers-{os.getuid()}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = directory.lstat()
    except OSError:
        return None
    import stat

    if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.getuid() or status.st_mode & 0o077:
        return None
    if len(os.fsencode(directory)) + _SOCKET_NAME_BYTES > _UNIX_PATH_BYTES:
        return None  # a socket's path there would be longer than a Unix socket's may be
    return directory


# sun_path holds 108 bytes with its terminating NUL; a socket's name is a 24-digit key + ".sock".
_UNIX_PATH_BYTES = 107
_SOCKET_NAME_BYTES = len("/") + 24 + len(".sock")


def _shared_key(environment: dict[str, str], uid: int | None = None) -> str:
    """One server per user (``uid``, default this process's), interpreter, comparable
    environment and process limits: a worker runs under the resource limits, cgroup and
    niceness of the server it is forked from, so a process under ``ulimit -v`` (or a
    full-disk ``ulimit -f``) gets a server of its own that has them."""
    import hashlib
    import resource

    try:
        with open("/proc/self/cgroup") as cgroup:
            group = cgroup.read()
    except OSError:
        group = ""
    limits = {name: list(resource.getrlimit(getattr(resource, name))) for name in sorted(dir(resource))
              if name.startswith("RLIMIT_")}
    identity = {
        # One user's server is never another's, whatever directory their sockets share.
        "uid": os.getuid() if uid is None else uid,
        # `python` and `python3` of one virtual environment are one interpreter.
        "python": [os.path.realpath(sys.executable), sys.prefix, sys.version],
        "env": _comparable(environment),
        "limits": limits,
        "cgroup": group,
        "nice": os.nice(0),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]


def _umask() -> int:
    """This process's umask (read without setting it, which would race other threads)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return -1


# A process normally runs every worker in one environment, so it has one server; one
# that runs them in several (the test suite, an API user with per-project variables)
# keeps the servers of the last few, each holding the libraries' memory.
MAX_SERVERS = 2
# Comparable environment (as JSON) -> its server, or None when it would not start.
_SERVERS: "dict[str, ForkServer | SharedForkServer | None]" = {}
_SERVERS_LOCK = threading.Lock()


def server_for(environment: dict[str, str]) -> "ForkServer | SharedForkServer | None":
    """The fork server for workers in ``environment``, started on first use; ``None`` when
    workers start as fresh interpreters instead (switched off, or it would not start)."""
    from edgebuild.core.config import FORK_SERVER_VARIABLE, fork_server_idle_seconds, fork_server_mode

    mode = fork_server_mode(environment)
    if mode == "off":
        return None
    directory = shared_directory(environment) if mode == "shared" else None
    key = json.dumps([_comparable(environment), str(directory)], sort_keys=True)
    with _SERVERS_LOCK:
        if key in _SERVERS:
            server = _SERVERS.pop(key)  # and back at the end: the most recently used
            if server is not None and not server.alive():
                server = None  # it died: workers go on as fresh interpreters
        else:
            server = None
            if directory is not None:
                try:
                    server = SharedForkServer(environment, directory, fork_server_idle_seconds(environment))
                except OSError:
                    server = None  # a server of this process's own, then
                else:
                    if server.started and not environment.get(FORK_SERVER_VARIABLE, "").strip():
                        # A process that outlives the command, started by default: said once, when it starts.
                        print(f"edgebuild: started a fork server for this command and your next ones (it exits after "
                              f"{fork_server_idle_seconds(environment):.0f} s unused; EDGEBUILD_FORK_SERVER=process "
                              "keeps none)", file=sys.stderr, flush=True)
            if server is None:
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


def start_in_background(environment: dict[str, str]) -> threading.Thread:
    """:func:`server_for` ``environment``, in a thread of its own: a process that knows a
    worker is coming has the server import its libraries beside its own planning. The
    first fork waits for this very server (``server_for`` holds its lock while one starts)."""
    thread = threading.Thread(target=server_for, args=(environment,), name="edgebuild-fork-server-start", daemon=True)
    thread.start()
    return thread


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
            _import_quietly(request.get("imports", ()))
            _fork_worker(request, descriptors, children, [connection])
            _import_quietly(request.get("after", ()))
        _reap(children)
        if os.getppid() != parent:
            break
    for pid in list(children):
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.05)


def serve_shared(path: str, idle_seconds: float, ready_descriptor: int) -> None:
    """The shared server: what :func:`serve` does, for any number of clients, each on a
    connection of its own, until it idles out, retires or loses its socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in PRELOAD:
        __import__(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # Made 0600 as it is made (no moment when another user may connect), and said again.
    old_umask = os.umask(0o077)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
    finally:
        os.umask(old_umask)
    listener.listen(16)
    own_inode = os.stat(path).st_ino
    loaded = _module_files()
    os.write(ready_descriptor, b"ready")
    os.close(ready_descriptor)
    # A worker's exit wakes the loop at once (its client waits for the status).
    wakeup_reader, wakeup_writer = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda number, frame: None)
    signal.set_wakeup_fd(wakeup_writer)
    connections: list[socket.socket] = []
    children: dict[int, socket.socket] = {}
    # Workers whose client is gone: pid -> when SIGKILL follows the SIGINT they were sent.
    orphans: dict[int, float] = {}
    retiring = False
    last_busy = time.monotonic()

    def retire() -> None:
        nonlocal retiring
        if not retiring:
            retiring = True
            _unlink_if_own(path, own_inode)
            listener.close()

    while True:
        # (A worker whose client is gone is not watched: its socket stays readable.)
        watched: list[Any] = [wakeup_reader, *connections, *(item for pid, item in children.items() if pid not in orphans)]
        if not retiring:
            watched.append(listener)
        try:
            ready, _, _ = select.select(watched, [], [], 1.0)
        except InterruptedError:
            ready = []
        for item in ready:
            if item == wakeup_reader:
                try:
                    os.read(wakeup_reader, 4096)
                except BlockingIOError:
                    pass
            elif item is listener:
                connection, _ = listener.accept()
                connections.append(connection)
            elif item in connections:
                try:
                    message, descriptors, _, _ = socket.recv_fds(item, MESSAGE_BYTES, 4)
                except OSError:
                    message, descriptors = b"", []
                if not message:
                    connections.remove(item)
                    item.close()
                    continue
                status = descriptors[3]
                request = json.loads(message)
                if not retiring and _module_files(loaded) != loaded:
                    retire()
                if retiring:
                    for own in descriptors:
                        if own != status:
                            os.close(own)
                    with socket.socket(fileno=status) as status_socket:
                        status_socket.sendall(b"stale\n")
                    continue
                loaded = _import_watched(request.get("imports", ()), loaded)
                _fork_worker(request, descriptors, children, [*connections, wakeup_reader, wakeup_writer,
                                                              *([] if retiring else [listener])])
                loaded = _import_watched(request.get("after", ()), loaded)
            else:
                # A worker's status socket is readable only when its client closed it: the
                # process that asked for the worker is gone. Stop the worker as Ctrl-C would.
                pid = next(pid for pid, status_socket in children.items() if status_socket is item)
                if pid not in orphans:
                    _signal(pid, signal.SIGINT)
                    orphans[pid] = time.monotonic() + ORPHAN_GRACE_SECONDS
        for pid, deadline in list(orphans.items()):
            if pid not in children:
                del orphans[pid]
            elif time.monotonic() > deadline:
                _signal(pid, signal.SIGKILL)
        _reap(children)
        now = time.monotonic()
        if connections or children:
            last_busy = now
        if not retiring and (now - last_busy > idle_seconds or not _is_own(path, own_inode)):
            retire()
        if retiring and not connections and not children:
            break


# How long a worker whose client is gone has to clean up after its SIGINT.
ORPHAN_GRACE_SECONDS = 10.0


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _is_own(path: str, inode: int) -> bool:
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


def _unlink_if_own(path: str, inode: int) -> None:
    if _is_own(path, inode):
        try:
            os.unlink(path)
        except OSError:
            pass


def _module_files(previous: "dict[str, int] | None" = None) -> dict[str, int]:
    """The modification time of every imported module's file (of those in ``previous``,
    when given: what changed since)."""
    names = previous.keys() if previous is not None else [
        module.__file__ for module in list(sys.modules.values())
        if isinstance(getattr(module, "__file__", None), str) and os.path.isabs(module.__file__)
    ]
    files: dict[str, int] = {}
    for name in names:
        try:
            files[name] = os.stat(name).st_mtime_ns
        except OSError:
            files[name] = -1
    return files


def _fork_worker(request: dict[str, Any], descriptors: list[int], children: dict[int, socket.socket],
                 servers_own: "list[socket.socket | int]") -> None:
    """Fork the worker ``request`` asks for with the client's ``descriptors`` (stdout,
    stderr, result, status); answer its pid on the status socket and keep that socket
    in ``children``. The child closes ``servers_own`` and every other child's socket
    (nothing of the server's or of another worker's reaches a worker)."""
    stdout_writer, stderr_writer, result_writer, status = descriptors
    # What the server imported is moved out of the collector's sight: a worker's full
    # collection (the QDQ build has two, to bound its memory) then walks only what the
    # worker made, 0.07 to 0.12 s less each with torch imported, and the imported objects'
    # pages stay shared with the server instead of being copied when the collector
    # touches their headers (the pattern Python's gc.freeze documents for fork servers).
    gc.freeze()
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        for own in (*servers_own, *children.values()):
            own.close() if isinstance(own, socket.socket) else os.close(own)
        os.close(status)
        _run_child(request, stdout_writer, stderr_writer, result_writer)
    for own in (stdout_writer, stderr_writer, result_writer):
        os.close(own)
    status_socket = socket.socket(fileno=status)
    status_socket.sendall(f"{pid}\n".encode())
    children[pid] = status_socket


def _import_quietly(modules: "list[str] | tuple[str, ...]") -> None:
    """Import what a kind's workers import, once each. One that fails (a plugin's missing
    library, a private module gone in another torch) is left to the worker, which
    imports it itself and reports what it finds; what it printed is dropped here (the
    server's own streams go nowhere). On one torch thread: see :func:`_one_torch_thread`."""
    pending = [module for module in modules if module not in sys.modules and module not in _FAILED_IMPORTS]
    if not pending:
        return
    with _one_torch_thread():
        for module in pending:
            try:
                __import__(module)
            except Exception:
                _FAILED_IMPORTS.add(module)


def _import_watched(modules: "list[str] | tuple[str, ...]", loaded: dict[str, int]) -> dict[str, int]:
    """:func:`_import_quietly`, then the files the shared server watches (``loaded``), with
    what those imports added: an edit of a kind's module retires the server too."""
    imported = len(sys.modules)
    _import_quietly(modules)
    return _module_files() if len(sys.modules) != imported else loaded


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch (and the BLAS under it) on one thread within the block. A module imported
    here may run torch (a kind's ``build_imports`` do work a build would do), and a process
    that has started OpenMP's threads and then forks leaves the child hanging at its first
    parallel region (measured with torch 2.13's CPU wheel: a matrix product in the parent,
    then one in the forked child, never returns). On one thread torch starts none; the
    count is put back after, and each worker starts its own threads when it needs them."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
        if "cwd" in request:
            os.chdir(request["cwd"])
        if request.get("umask", -1) >= 0:
            os.umask(request["umask"])
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
    if sys.argv[1] == "--shared":
        serve_shared(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
    else:
        serve(int(sys.argv[1]))
