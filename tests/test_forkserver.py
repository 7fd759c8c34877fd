"""Workers forked from the fork server: each still a process of its own (killed alone,
its exit status its own), the server kept for the next one, and a fresh interpreter
wherever the server cannot serve (switched off, another environment)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from edgebuild.core.config import Settings
from edgebuild.errors import WorkerError
from edgebuild.run import forkserver
from edgebuild.run.workers import _process_environment, run_worker
from edgebuild.run.workspace import Workspace

from helpers import clone_project


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


def test_a_server_per_environment_and_none_where_switched_off() -> None:
    environment = _process_environment(dict(os.environ))
    server = forkserver.server_for(environment)
    if server is None:
        pytest.skip("no fork server could start in this process")
    # Edgebuild's own settings differ per worker: the same server.
    assert forkserver.server_for(environment | {"EDGEBUILD_JOBS": "2"}) is server
    # Anything a library may have read at import differs: a server of its own.
    other = forkserver.server_for(environment | {"A_LIBRARY_SETTING_READ_AT_IMPORT": "on"})
    assert other is not None and other is not server
    assert forkserver.server_for(environment) is server
    assert forkserver.server_for(environment | {"EDGEBUILD_FORK_SERVER": "0"}) is None


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
