"""A cache is a cache (issue 60): a command answers without ``cache/statcache.sqlite`` or
``cache/doit.json`` where they cannot be used -- read-only, a full disk, locked by another
process, a table dropped, a link in their place -- saying so in one line per file and
exiting as it would otherwise, never with a traceback, never losing what they held.
And the shared fork server is the user's own: a socket of another user's is never used."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from edgebuild.core.statcache import BUSY_SECONDS, StatCache
from edgebuild.run import forkserver

from helpers import ProjectDir, clone_project, require_installed_commands, seeded_bytes, settle

NOT_KEPT = ": digests taken afresh and not kept"
NOT_REMEMBERED = "; this run's results are not remembered (edgebuild's fingerprints decide what is stale)"
UP_TO_DATE = "t  up to date (verified)\n"


def doit(project: ProjectDir, *args: str, before_exec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    """``doit ARGS`` in ``project`` as ``ProjectDir.doit`` runs it, with ``before_exec`` run
    in the child first (a resource limit, a user namespace)."""
    require_installed_commands()
    environment = {key: value for key, value in os.environ.items() if key not in ("EDGEBUILD_MANIFEST", "EDGEBUILD_VERBOSE")}
    environment["EDGEBUILD_REMOTE_CACHE"] = "off"
    return subprocess.run([str(Path(sys.executable).with_name("doit")), *args], cwd=project.root, env=environment,
                          capture_output=True, text=True, timeout=600, preexec_fn=before_exec)


def file_modes_enforced() -> Callable[[], None]:
    """What makes a child process meet file modes as any user does. As root they are not
    enforced; in a user namespace of its own (no uid mapped) root keeps its files but
    loses the power to override their modes, as the kernel checks it. Skips where
    neither holds."""
    if os.geteuid() != 0:
        return lambda: None
    clone_newuser = 0x10000000
    libc = ctypes.CDLL(None, use_errno=True)
    probe = subprocess.run([sys.executable, "-c", "import ctypes, os; os._exit(ctypes.CDLL(None).unshare(0x10000000) != 0)"],
                           timeout=60)
    if probe.returncode != 0:
        pytest.skip("running as root, and user namespaces are not available here: file modes cannot be enforced")

    def in_a_user_namespace() -> None:
        if libc.unshare(clone_newuser) != 0:
            os._exit(99)

    return in_a_user_namespace


def read_only(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        path.chmod(stat.S_IMODE(path.lstat().st_mode) & ~0o222)


def writable(directory: Path) -> None:
    for path in [directory, *directory.rglob("*")]:
        path.chmod(stat.S_IMODE(path.lstat().st_mode) | 0o200)


def stderr_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result.stderr.splitlines()


@pytest.mark.slow
def test_a_read_only_cache_is_answered_without(verified_seed: Path, tmp_path: Path) -> None:
    """Issue 60: ``doit status`` printed only the save error, ``doit verify`` two
    tracebacks of doit's. A clone: every file's path is new to the stat cache."""
    project = clone_project(verified_seed, tmp_path / "p")
    cache = project.root / "cache"
    state = (cache / "doit.json").read_bytes()
    before_exec = file_modes_enforced()
    read_only(cache)
    try:
        status = doit(project, "status", before_exec=before_exec)
        verified = doit(project, "verify", before_exec=before_exec)
    finally:
        writable(cache)
    assert (status.returncode, status.stdout) == (0, UP_TO_DATE), status.stdout + status.stderr
    assert stderr_lines(status) == [f"edgebuild: {cache / 'statcache.sqlite'}: read-only{NOT_KEPT}"]
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: 1 passed, 0 failed, 0 not run" in verified.stdout
    assert stderr_lines(verified) == [
        f"edgebuild: {cache / 'statcache.sqlite'}: read-only{NOT_KEPT}",
        f"edgebuild: {cache / 'doit.json'}: cannot save doit's state (Permission denied){NOT_REMEMBERED}",
    ]
    # Nothing lost: doit's state is as it was, and with the cache writable again it is used.
    assert (cache / "doit.json").read_bytes() == state
    again = doit(project, "verify")
    assert again.returncode == 0 and stderr_lines(again) == [], again.stdout + again.stderr
    assert json.loads((cache / "doit.json").read_text()).keys() == json.loads(state).keys()


@pytest.mark.slow
def test_a_full_disk_is_answered_without_the_caches_and_loses_nothing(verified_seed: Path, tmp_path: Path) -> None:
    """``ulimit -f``: a write past 64 bytes fails (EFBIG) as on a full disk. doit's own
    backend truncated its state before writing it, and ended in a traceback."""
    project = clone_project(verified_seed, tmp_path / "p")
    cache = project.root / "cache"
    state = (cache / "doit.json").read_bytes()
    assert len(state) > 64

    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))

    verified = doit(project, "verify", before_exec=full_disk)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: 1 passed, 0 failed, 0 not run" in verified.stdout
    said = stderr_lines(verified)
    assert len(said) == 2, said
    assert said[0].startswith(f"edgebuild: {cache / 'statcache.sqlite'}: ") and said[0].endswith(NOT_KEPT), said
    assert said[1] == f"edgebuild: {cache / 'doit.json'}: cannot save doit's state (File too large){NOT_REMEMBERED}"
    assert (cache / "doit.json").read_bytes() == state
    assert [path.name for path in cache.iterdir() if path.name.startswith(".doit.json")] == []
    with sqlite3.connect(cache / "statcache.sqlite") as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    status = doit(project, "status")
    assert (status.returncode, status.stdout, status.stderr) == (0, UP_TO_DATE, "")


@pytest.mark.slow
@pytest.mark.parametrize("table", ["files", "meta"])
def test_a_stat_cache_missing_a_table_is_started_afresh(verified_seed: Path, tmp_path: Path, table: str) -> None:
    """Issue 60: a dropped table made every later command fail."""
    project = clone_project(verified_seed, tmp_path / "p")
    cache = project.root / "cache" / "statcache.sqlite"
    with sqlite3.connect(cache) as connection:
        connection.execute(f"DROP TABLE {table}")
    status = doit(project, "status")
    assert (status.returncode, status.stdout) == (0, UP_TO_DATE), status.stdout + status.stderr
    assert stderr_lines(status) == [f"edgebuild: {cache}: damaged stat cache (no such table: {table}); started afresh, "
                                    "the files it described are hashed again"]
    again = doit(project, "status")
    assert (again.returncode, again.stdout, again.stderr) == (0, UP_TO_DATE, "")
    with sqlite3.connect(cache) as connection:
        assert connection.execute("SELECT count(*) FROM files").fetchone()[0] > 0


@pytest.mark.slow
def test_a_stat_cache_another_process_holds_locked_is_waited_for_briefly(verified_seed: Path, tmp_path: Path) -> None:
    """Issue 60: ``doit status`` waited 64 s, silent, and then failed."""
    project = clone_project(verified_seed, tmp_path / "p")
    cache = project.root / "cache" / "statcache.sqlite"
    holder = sqlite3.connect(cache, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        status = doit(project, "status")
        took = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (status.returncode, status.stdout) == (0, UP_TO_DATE), status.stdout + status.stderr
    assert stderr_lines(status) == [f"edgebuild: {cache}: locked by another process for over {BUSY_SECONDS:g} s{NOT_KEPT}"]
    assert took < 30, took


def test_a_save_gives_up_on_a_lock_held_past_the_wait_and_keeps_nothing(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(seeded_bytes(1000, 1))
    settle()
    cache_path = tmp_path / "statcache.sqlite"
    StatCache(cache_path).save()  # nothing to save: no file made
    assert not cache_path.exists()
    first = StatCache(cache_path)
    first.file_digest(data)
    first.save()
    data.write_bytes(seeded_bytes(1000, 2))
    settle()
    holder = sqlite3.connect(cache_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        locked_out = StatCache(cache_path)
        digest = locked_out.file_digest(data)
        started = time.monotonic()
        locked_out.save()
        took = time.monotonic() - started
        # The lookups after go on without the file; the digest taken stays in memory.
        assert locked_out.file_digest(data) == digest
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert BUSY_SECONDS - 0.2 <= took <= BUSY_SECONDS + 1.5, took
    assert capsys.readouterr().err == f"edgebuild: {cache_path}: locked by another process for over {BUSY_SECONDS:g} s{NOT_KEPT}\n"
    # Not kept: the next process reads the file again.
    after = StatCache(cache_path)
    after.file_digest(data)
    assert after.bytes_hashed == 1000


@pytest.mark.slow
def test_a_stat_cache_that_is_a_link_is_never_written_through_and_the_command_goes_on(verified_seed: Path,
                                                                                     tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    cache = project.root / "cache" / "statcache.sqlite"
    outside = tmp_path / "outside"
    outside.mkdir()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{cache}{suffix}").unlink(missing_ok=True)
    cache.symlink_to(outside / "db.sqlite")
    status = doit(project, "status")
    assert (status.returncode, status.stdout) == (0, UP_TO_DATE), status.stdout + status.stderr
    assert stderr_lines(status) == [f"edgebuild: {cache}: a symbolic link (to {outside / 'db.sqlite'}); the stat cache is "
                                    f"never written through a link: remove it{NOT_KEPT}"]
    assert list(outside.iterdir()) == []


# --- the fork server is the user's own -----------------------------------------------------


def _sockets() -> Path:
    # Short: a Unix socket's path holds 107 bytes.
    return Path(tempfile.mkdtemp(prefix="eb-"))


def test_a_socket_of_another_users_is_never_connected_to() -> None:
    """Where the shared server's socket would be: a socket file another user owns, or one
    whose server runs as another user (its file this user's: the kernel's SO_PEERCRED
    says whose). Neither is used, nor removed."""
    if os.geteuid() != 0:
        pytest.skip("needs a process of another user, which only root can start here")
    environment = dict(os.environ, EDGEBUILD_FORK_SERVER="shared")
    sockets = _sockets()
    try:
        path = sockets / f"{forkserver._shared_key(environment)}.sock"
        listener = subprocess.Popen(
            [sys.executable, "-c",
             "import os, socket, sys\n"
             "server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
             "server.bind(sys.argv[1])\n"
             "os.setuid(65534)\n"
             "server.listen(4)\n"
             "print('listening', flush=True)\n"
             "sys.stdin.read()\n", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert listener.stdout.readline() == "listening\n"
            with pytest.raises(forkserver.AnotherUsersServer, match=r"the fork server listening there runs as uid 65534"):
                forkserver.SharedForkServer(environment, sockets, 60)
            assert stat.S_ISSOCK(path.lstat().st_mode)
            os.chown(path, 65534, 65534, follow_symlinks=False)
            with pytest.raises(forkserver.AnotherUsersServer, match=r"not a socket of this user's"):
                forkserver.SharedForkServer(environment, sockets, 60)
            assert path.lstat().st_uid == 65534
        finally:
            listener.stdin.close()
            listener.wait(timeout=30)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.mark.slow
def test_the_shared_server_listens_on_a_socket_of_this_user_alone() -> None:
    from edgebuild.run.workers import _process_environment

    sockets = _sockets()
    environment = _process_environment(dict(os.environ, EDGEBUILD_FORK_SERVER="shared",
                                            EDGEBUILD_FORK_SERVER_DIR=str(sockets), EDGEBUILD_FORK_SERVER_IDLE="30"))
    try:
        server = forkserver.SharedForkServer(environment, sockets, 30)
        try:
            status = server.path.lstat()
            assert (stat.S_ISSOCK(status.st_mode), stat.S_IMODE(status.st_mode), status.st_uid) == (True, 0o600, os.getuid())
            assert forkserver._peer_uid(server._socket) == os.getuid()
            # The user is part of the server's name: another user's server for the same
            # interpreter, environment and limits is named otherwise.
            assert server.path.name == f"{forkserver._shared_key(environment, uid=os.getuid())}.sock"
            assert server.path.name != f"{forkserver._shared_key(environment, uid=os.getuid() + 1)}.sock"
        finally:
            server.close()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
