"""Workers forked from the fork server: each still a process of its own (killed alone,
its exit status its own), the server kept for the next one, and a fresh interpreter
wherever the server cannot serve (switched off, another environment). The shared
server (``EDGEBUILD_FORK_SERVER=shared``, what the rest of the suite runs on) serves
several processes, stops a worker whose client is gone, and retires when the code it
imported changes or its socket is removed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from edgebuild.core.config import Settings
from edgebuild.errors import WorkerError
from edgebuild.run import forkserver
from edgebuild.run.workers import _process_environment, run_worker
from edgebuild.run.workspace import Workspace

from helpers import TOWER_MANIFEST, clone_project


@pytest.fixture(autouse=True)
def _servers_of_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-process servers (the default on CI) unless a test asks for the shared one."""
    monkeypatch.setenv("EDGEBUILD_FORK_SERVER", "process")


def lines() -> tuple[list[str], object]:
    seen: list[str] = []
    return seen, lambda stream, line: seen.append(line)


@pytest.mark.slow
def test_a_killed_forked_worker_dies_alone_and_the_next_one_forks_from_the_same_server(verified_seed: Path,
                                                                                       tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "build" / "t" / "report.json").unlink()
    workspace = Workspace.open(project.root / "artifacts.yaml", project.root,
                               Settings.from_environ().replace(remote_cache="off"))
    artifact = workspace.artifact("t")
    environment = _process_environment(workspace.worker_environment())
    server = forkserver.server_for(environment)
    assert server is not None and server.process.poll() is None

    with pytest.raises(WorkerError) as killed:
        run_worker("verify", workspace, artifact, lines()[1], env=dict(os.environ, EDGEBUILD_FAULT="verify.after_report=kill"))
    assert re.fullmatch(r"t: the verify process \(pid \d+\) was killed by SIGKILL \(out of memory\? .*", str(killed.value))
    pid = int(re.search(r"pid (\d+)", str(killed.value)).group(1))
    assert pid not in (os.getpid(), server.process.pid)
    # The server lives on, and the next worker is forked from it: a verification that passes.
    assert server.process.poll() is None and forkserver.server_for(environment) is server
    seen, relay = lines()
    assert run_worker("verify", workspace, artifact, relay) == {"verify_fingerprint": artifact.verify_fingerprint}
    assert any("# t (qwen3_5_vision_tower): PASSED" in line for line in seen), seen


@pytest.mark.slow
def test_a_fork_server_killed_under_its_worker_is_said_so_with_what_was_left(verified_seed: Path, tmp_path: Path) -> None:
    """A (shared) fork server killed mid-run takes its workers with it: that is said, not
    "out of memory?", and so is what the worker left -- here its report, written and
    passed before the stall point, as the next command finds it."""
    from edgebuild.run.state import VerificationState, verification_state

    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "build" / "t" / "report.json").unlink()
    workspace = Workspace.open(project.root / "artifacts.yaml", project.root,
                               Settings.from_environ().replace(remote_cache="off"))
    server = forkserver.server_for(_process_environment(workspace.worker_environment()))
    assert server is not None

    def relay(stream: str, line: str) -> None:
        if line.startswith("fault: stalling at verify.after_report"):
            server.process.kill()

    with pytest.raises(WorkerError) as lost:
        run_worker("verify", workspace, workspace.artifact("t"), relay,
                   env=dict(os.environ, EDGEBUILD_FAULT="verify.after_report=stall"))
    assert re.fullmatch(
        r"t: the verify process \(pid \d+\) ended with the fork server it was forked from \(the server was stopped or "
        r"killed before the worker ended; a shared one by another command, or by hand\); its report was complete and "
        r"passed before it ended: t is verified, and kept in the store and pushed by the run that started it",
        str(lost.value)), str(lost.value)
    again = Workspace.open(project.root / "artifacts.yaml", project.root,
                           Settings.from_environ().replace(remote_cache="off"))
    assert verification_state(again, again.artifact("t")) is VerificationState.VERIFIED


def test_workers_fork_from_a_shared_server_by_default_and_from_the_command_s_own_on_ci() -> None:
    from edgebuild.core.config import fork_server_mode

    assert fork_server_mode({}) == "shared"
    assert fork_server_mode({"CI": "true"}) == "process"
    assert fork_server_mode({"CI": "1"}) == "process"
    assert fork_server_mode({"CI": "false"}) == "shared"
    assert fork_server_mode({"CI": ""}) == "shared"
    assert fork_server_mode({"CI": "true", "EDGEBUILD_FORK_SERVER": "shared"}) == "shared"
    assert fork_server_mode({"EDGEBUILD_FORK_SERVER": "process"}) == "process"
    assert fork_server_mode({"EDGEBUILD_FORK_SERVER": "1"}) == "process"
    assert fork_server_mode({"EDGEBUILD_FORK_SERVER": "off"}) == "off"
    assert fork_server_mode({"CI": "true", "EDGEBUILD_FORK_SERVER": "0"}) == "off"


@pytest.mark.parametrize("variable, value, expected", [
    ("EDGEBUILD_FORK_SERVER", "shraed", "EDGEBUILD_FORK_SERVER: expected shared, process or 0 (off), found 'shraed'"),
    ("EDGEBUILD_FORK_SERVER_IDLE", "5m", "EDGEBUILD_FORK_SERVER_IDLE: expected a number of seconds above 0, at most "
                                         "86400, found '5m'"),
    ("EDGEBUILD_FORK_SERVER_IDLE", "0", "EDGEBUILD_FORK_SERVER_IDLE: expected a number of seconds above 0, at most "
                                        "86400, found '0'"),
])
def test_a_fork_server_switch_of_the_wrong_shape_stops_the_command_in_one_line(project_dir, variable: str, value: str,
                                                                              expected: str) -> None:
    """A typo in a switch read deep in a run would quietly start workers another way (or
    keep a server another time): every command refuses it before it does anything."""
    from edgebuild.core.config import check_process_switches

    for good in ({}, {"EDGEBUILD_FORK_SERVER": "shared"}, {"EDGEBUILD_FORK_SERVER": " Process "},
                 {"EDGEBUILD_FORK_SERVER": "off"}, {"EDGEBUILD_FORK_SERVER": "1"}, {"EDGEBUILD_FORK_SERVER_IDLE": "30.5"}):
        check_process_switches(good)
    project_dir.manifest(TOWER_MANIFEST)
    # As for a setting: doit's loading of the tasks stops with 2, an edgebuild command with 3.
    for command, status, line in ((("list",), 2, f"edgebuild: error: {expected}\n"), (("status",), 3, f"ERROR: {expected}\n"),
                                  (("build",), 3, f"ERROR: {expected}\n")):
        result = project_dir.doit(*command, env={variable: value})
        assert (result.returncode, result.stderr) == (status, line), (command, result.stderr)
    assert not (project_dir.root / "build").exists()


@pytest.mark.slow
def test_with_no_switch_set_a_worker_forks_from_the_shared_server_and_on_ci_from_one_of_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    environment = _shared(tmp_path)
    sockets = Path(environment["EDGEBUILD_FORK_SERVER_DIR"])
    del environment["EDGEBUILD_FORK_SERVER"]
    environment.pop("CI", None)
    try:
        shared = forkserver.server_for(environment)
        assert isinstance(shared, forkserver.SharedForkServer)
        assert [path.suffix for path in sockets.glob("*.sock")] == [".sock"]
        # Started by default, not asked for: said once, on stderr.
        said = capsys.readouterr().err
        assert said == ("edgebuild: started a fork server for this command and your next ones (it exits after 60 s "
                        "unused; EDGEBUILD_FORK_SERVER=process keeps none)\n")
        own = forkserver.server_for(environment | {"CI": "true"})
        assert isinstance(own, forkserver.ForkServer)
        assert len(list(sockets.glob("*.sock"))) == 1  # it listens on no shared socket
    finally:
        _stop_servers(sockets)


@pytest.mark.slow
def test_a_server_per_environment_and_none_where_switched_off() -> None:
    environment = _process_environment(dict(os.environ))
    server = forkserver.server_for(environment)
    if server is None:
        pytest.skip("no fork server could start in this process")
    # Edgebuild's own settings differ per worker: the same server.
    assert forkserver.server_for(environment | {"EDGEBUILD_JOBS": "2"}) is server
    # What torch writes into its own process's environment once it has run: the same server.
    assert forkserver.server_for(environment | {"TORCHINDUCTOR_CACHE_DIR": "inductor-cache"}) is server
    # Anything a library may have read at import differs: a server of its own.
    other = forkserver.server_for(environment | {"A_LIBRARY_SETTING_READ_AT_IMPORT": "on"})
    assert other is not None and other is not server
    assert forkserver.server_for(environment) is server
    assert forkserver.server_for(environment | {"EDGEBUILD_FORK_SERVER": "0"}) is None



def _server_processes() -> list[int]:
    """This process's children that are fork servers."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != os.getpid():
                continue
            if b"edgebuild.run.forkserver" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.slow
def test_a_server_started_early_is_the_one_the_first_worker_forks_from(tmp_path: Path) -> None:
    """``start_in_background`` starts the server beside the caller's own work; the first
    fork waits for that server instead of starting a second one, and the worker finds
    what the server imported moved out of the collector's sight (``gc.freeze``)."""
    (tmp_path / "freeze_marker.py").write_text(
        "import gc, os\nwith open(os.environ['MARKER_FILE'], 'a') as file:\n    file.write(f'{gc.get_freeze_count()}\\n')\n"
    )
    environment = _process_environment(dict(os.environ, PYTHONPATH=str(tmp_path), MARKER_FILE=str(tmp_path / "frozen"),
                                            A_VARIABLE_OF_THIS_TEST_ONLY="early"))
    before = set(_server_processes())
    thread = forkserver.start_in_background(environment)
    server = forkserver.server_for(environment)  # at once: it waits for the one starting
    thread.join(timeout=120)
    if server is None:
        pytest.skip("no fork server could start in this process")
    assert not thread.is_alive()
    assert set(_server_processes()) - before == {server.process.pid}
    assert _fork_and_wait(server, environment, ("no_such_module_anywhere",)) == 2
    assert _fork_and_wait(server, environment, ("freeze_marker",)) == 2
    # Imported by the server after its first fork, which froze all it held then: torch's objects and more.
    assert int((tmp_path / "frozen").read_text().split()[0]) > 10_000

@pytest.mark.slow
def test_a_kinds_worker_imports_are_imported_once_in_the_server(tmp_path: Path) -> None:
    """The modules a fork asks for are imported by the server, once: the next worker
    starts with them. One that does not import is left to the worker; the fork goes on."""
    (tmp_path / "marker_module.py").write_text(
        "import os\nwith open(os.environ['MARKER_FILE'], 'a') as file:\n    file.write(f'{os.getpid()}\\n')\n"
    )
    marker = tmp_path / "imported-by"
    environment = _process_environment(dict(os.environ, PYTHONPATH=str(tmp_path), MARKER_FILE=str(marker)))
    server = forkserver.server_for(environment)
    if server is None:
        pytest.skip("no fork server could start in this process")
    statuses = []
    for _ in range(2):
        reader, writer = os.pipe()
        worker = server.fork(["no-such-mode"], environment, writer, ("no_such_module_anywhere", "marker_module"))
        os.close(writer)
        with os.fdopen(reader, "rb") as result:
            result.read()
        statuses.append(worker.wait(timeout=60))
        worker.stdout.close()
        worker.stderr.close()
    # argparse refuses the mode: each worker ran (and exited 2) after the imports.
    assert statuses == [2, 2]
    assert marker.read_text().split() == [str(server.process.pid)]


@pytest.mark.slow
def test_a_kinds_warmups_are_imported_after_the_fork_that_asks(tmp_path: Path) -> None:
    """``after`` (a kind's ``build_warmups``) is imported by the server once it has forked
    the worker that asked, so that worker does not wait for it: here the module's import
    waits until the test has its worker, which it would never have if the server imported
    first. Imported once: the next fork finds it imported."""
    go = tmp_path / "go"
    (tmp_path / "warmup_module.py").write_text(
        "import os, time\n"
        f"deadline = time.monotonic() + 60\nwhile not os.path.exists({str(go)!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        f"found = os.path.exists({str(go)!r})\n"
        "with open(os.environ['MARKER_FILE'], 'a') as file:\n    file.write(f'{os.getpid()} {found}\\n')\n"
    )
    environment = _marker_environment(tmp_path)
    server = forkserver.server_for(environment)
    if server is None:
        pytest.skip("no fork server could start in this process")
    started = time.monotonic()

    def forked_at_once() -> None:
        assert time.monotonic() - started < 30, "the server imported the warm-up before it forked"
        go.touch()

    assert _fork_and_wait(server, environment, (), ("warmup_module",), forked_at_once) == 2
    assert _fork_and_wait(server, environment, (), ("warmup_module",)) == 2
    assert (tmp_path / "imported-by").read_text().split("\n") == [f"{server.process.pid} True", ""]


def _marker_environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment whose workers can import ``marker_module``, which appends its
    importer's pid to ``imported-by``."""
    (tmp_path / "marker_module.py").write_text(
        "import os\nwith open(os.environ['MARKER_FILE'], 'a') as file:\n    file.write(f'{os.getpid()}\\n')\n"
    )
    return _process_environment(dict(os.environ, PYTHONPATH=str(tmp_path), MARKER_FILE=str(tmp_path / "imported-by"),
                                      **extra))


def _fork_and_wait(server, environment: dict[str, str], imports: tuple[str, ...] = ("marker_module",),
                   after: tuple[str, ...] = (), forked: "Callable[[], None] | None" = None) -> int:
    """A worker forked with ``imports`` and ``after``, run to its end (``forked()`` first)."""
    reader, writer = os.pipe()
    worker = server.fork(["no-such-mode"], environment, writer, imports, after)
    if forked is not None:
        forked()
    os.close(writer)
    with os.fdopen(reader, "rb") as result:
        result.read()
    status = worker.wait(timeout=60)
    worker.stdout.close()
    worker.stderr.close()
    return status


def _shared(tmp_path: Path, **extra: str) -> dict[str, str]:
    # A short directory of its own (mkdtemp: mode 0700): a Unix socket's path has at most
    # 107 bytes, which pytest's temporary directories under xdist can pass.
    import tempfile

    sockets = Path(tempfile.mkdtemp(prefix="eb-"))
    return _marker_environment(tmp_path, EDGEBUILD_FORK_SERVER="shared", EDGEBUILD_FORK_SERVER_DIR=str(sockets),
                               EDGEBUILD_FORK_SERVER_IDLE="60", **extra)


def _wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def _stop_servers(sockets: Path) -> None:
    """Remove the sockets: each server retires (the suite's own servers go the same way)."""
    import shutil

    shutil.rmtree(sockets, ignore_errors=True)


@pytest.mark.slow
def test_the_shared_server_serves_several_processes_and_retires_when_its_code_changes(tmp_path: Path) -> None:
    environment = _shared(tmp_path)
    sockets = Path(environment["EDGEBUILD_FORK_SERVER_DIR"])
    marker = tmp_path / "imported-by"
    try:
        # Two clients (as two doit processes would be): one server, which imports once.
        first = forkserver.SharedForkServer(environment, sockets, 60)
        second = forkserver.SharedForkServer(environment, sockets, 60)
        assert _fork_and_wait(first, environment) == 2 and _fork_and_wait(second, environment) == 2
        assert len(marker.read_text().split()) == 1
        [server_pid] = marker.read_text().split()
        assert int(server_pid) not in (os.getpid(),)
        # An edited module: the server retires, the next fork comes from a new one that imports it again.
        time.sleep(0.01)
        (tmp_path / "marker_module.py").write_text((tmp_path / "marker_module.py").read_text() + "# edited\n")
        assert _fork_and_wait(second, environment) == 2
        pids = marker.read_text().split()
        assert len(pids) == 2 and pids[1] != server_pid, pids
        # The retired server goes once no client holds a connection to it.
        first.close()
        assert _wait_for(lambda: not _alive(int(server_pid))), "the retired server is still running"
        second.close()
    finally:
        _stop_servers(sockets)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (this process started it and has not reaped it) has stopped all the same.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_a_worker_whose_process_is_killed_is_stopped_and_the_server_goes_when_its_socket_does(
        verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "build" / "t" / "report.json").unlink()
    environment = _shared(tmp_path, EDGEBUILD_REMOTE_CACHE="off", EDGEBUILD_FAULT="verify.after_report=stall")
    sockets = Path(environment["EDGEBUILD_FORK_SERVER_DIR"])
    # A client (as doit is) forks a verification that hangs, says the worker's pid once
    # the worker is hanging, and is then killed: nobody waits for that worker any more.
    (tmp_path / "client.py").write_text(
        "import os, sys\n"
        "from edgebuild.run import forkserver\n"
        "server = forkserver.SharedForkServer(dict(os.environ), forkserver.Path(sys.argv[1]), 60)\n"
        "reader, writer = os.pipe()\n"
        "argv = ['verify', sys.argv[2], sys.argv[3], 't', '--result-fd', forkserver.RESULT_FD_PLACEHOLDER]\n"
        "worker = server.fork(argv, dict(os.environ), writer, ('marker_module',))\n"
        "for line in worker.stderr:\n"
        "    if b'stall' in line:\n"
        "        print(worker.pid, flush=True)\n"
        "        break\n"
        "while True:\n"
        "    pass\n"
    )
    client = subprocess.Popen(
        [sys.executable, str(tmp_path / "client.py"), str(sockets), str(project.root / "artifacts.yaml"), str(project.root)],
        env=environment, stdout=subprocess.PIPE, text=True,
    )
    try:
        worker_pid = int(client.stdout.readline())
        server_pid = int((tmp_path / "imported-by").read_text().split()[0])
        assert _alive(worker_pid)
        client.send_signal(signal.SIGKILL)
        client.wait(timeout=30)
        # The server sees the client's end close: the worker is interrupted (it cleans
        # up) and gone long before its 600 s stall, and the server lives on.
        assert _wait_for(lambda: not _alive(worker_pid), seconds=forkserver.ORPHAN_GRACE_SECONDS + 20)
        assert _alive(server_pid)
        scratch = project.root / "build" / ".tmp"
        assert not scratch.exists() or not list(scratch.iterdir()), list(scratch.iterdir())
    finally:
        if client.poll() is None:
            client.kill()
        client.stdout.close()
        _stop_servers(sockets)
    assert _wait_for(lambda: not _alive(server_pid)), "the server outlived its socket"


@pytest.mark.slow
def test_a_socket_directory_open_to_others_or_too_deep_is_not_used(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir(mode=0o700)
    assert forkserver.shared_directory({"EDGEBUILD_FORK_SERVER_DIR": str(deep)}) is None
    sockets = tmp_path / "open"
    sockets.mkdir()
    sockets.chmod(0o755)
    environment = _process_environment(dict(os.environ, EDGEBUILD_FORK_SERVER="shared",
                                            EDGEBUILD_FORK_SERVER_DIR=str(sockets)))
    assert forkserver.shared_directory(environment) is None
    # Workers still fork, from a server of this process's own.
    server = forkserver.server_for(environment)
    assert server is None or isinstance(server, forkserver.ForkServer)
    assert list(sockets.iterdir()) == []
