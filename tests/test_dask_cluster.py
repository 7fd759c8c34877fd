"""``doit build --dask`` / ``doit verify --dask`` on a real Dask cluster: a scheduler and
worker processes on 127.0.0.1, each worker with resources of its own, started and
stopped here with bounded waits. Also the resource estimate and the refusals that need
no cluster (no remote cache, a read-only one)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgebuild.run.costs import LOCK_SOURCE, Cost
from edgebuild.run.executors.resources import PROCESS_FOOTPRINT_BYTES, task_resources
from edgebuild.core.lock_format import render_lock
from edgebuild.cache.remote import RemoteCache
from edgebuild.core.config import without_settings

from helpers import REPO, TOWER_MANIFEST, ProjectDir, clone_project, needs

pytestmark = needs("distributed")

DASK = str(Path(sys.executable).with_name("dask"))
START_TIMEOUT = 60
# The cluster's tasks: t (from the session's seed) and u, independent; q consumes t.
THREE = TOWER_MANIFEST + f"""\
  u:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 96
  q:
    kind: qwen3_5_tower_qdq
    source: t
    calibration:
      images: [{REPO / "data" / "calibration"}/*.png]
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """``dask scheduler`` and ``dask worker`` processes on loopback, each in a process group
    of its own (a worker is its nanny and the worker process under it: killing the group
    is losing the machine)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    def _environment(self, extra: dict[str, str]) -> dict[str, str]:
        environment = without_settings(os.environ)
        # The workers import this checkout's edgebuild, and share two cores between them.
        environment["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
        environment["EDGEBUILD_JOBS"] = "2"
        return environment | extra

    def _start(self, name: str, command: list[str], extra: dict[str, str]) -> None:
        log = self.root / f"{name}.log"
        with open(log, "w") as handle:
            self.processes[name] = subprocess.Popen(
                command, stdout=handle, stderr=subprocess.STDOUT, env=self._environment(extra), start_new_session=True
            )
        self.logs[name] = log

    def start_scheduler(self, extra: dict[str, str] | None = None) -> None:
        self._start("scheduler", [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                  "--dashboard-address", "127.0.0.1:0"], extra or {})
        self._wait_for(lambda: _listening(self.port), "the scheduler to listen", "scheduler")

    def start_worker(self, name: str, memory: str, extra: dict[str, str] | None = None) -> None:
        self._start(name, [DASK, "worker", self.address, "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0",
                           "--nthreads", "1", "--name", name, "--resources", f"MEMORY={memory}",
                           "--local-directory", str(self.root / name)], extra or {})
        self._wait_for(lambda: "Registered to:" in self.logs[name].read_text(), f"worker {name} to register", name)

    def worker_address(self, name: str) -> str:
        match = re.search(r"Start worker at:\s+(tcp://\S+)", self.logs[name].read_text())
        assert match, self.logs[name].read_text()
        return match.group(1)

    def kill(self, name: str) -> None:
        os.killpg(self.processes[name].pid, signal.SIGKILL)
        self.processes[name].wait(timeout=30)

    def _wait_for(self, condition, what: str, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.processes[name].poll() is not None:
                pytest.fail(f"{name} exited with {self.processes[name].returncode}:\n{self.logs[name].read_text()}")
            if condition():
                return
            time.sleep(0.2)
        pytest.fail(f"waited {START_TIMEOUT} s for {what}:\n{self.logs[name].read_text()}")

    def stop(self) -> None:
        for name, process in reversed(list(self.processes.items())):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=20)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path]):
    """A scheduler and two workers of one thread each, offering different memory; the
    workers sign what they push with the team's key."""
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    signs = {"EDGEBUILD_SIGNING_KEY": f"{keys['team']}.key"}
    try:
        cluster.start_scheduler()
        cluster.start_worker("w1", "4e9", signs)
        cluster.start_worker("w2", "3e9", signs)
        yield cluster
    finally:
        cluster.stop()


def outputs_of(root: Path, name: str) -> dict:
    return json.loads((root / "build" / name / ".edgebuild.json").read_text())["outputs"]


# --- no cluster needed -----------------------------------------------------------------


@pytest.mark.slow
def test_memory_is_estimated_from_the_weights_and_the_kind(project_dir: ProjectDir) -> None:
    images = REPO / "data" / "calibration"
    project_dir.manifest(
        THREE.replace("checkpoints:\n", "checkpoints:\n  siglip:\n    fixture: siglip_tiny\n", 1)
        + "  s:\n    kind: siglip_f143\n    checkpoint: siglip\n    device: cuda\n"
        + f"    calibration:\n      images: [{images}/*.png]\n"
    )
    project = project_dir.project()
    tower_weights = sum(
        4 * _elements(entry.shape) for entry in project.checkpoint("qwen").select(("model.visual.",)).values()
    )
    resources, basis = task_resources(project.artifact("t"), None)
    assert resources == {"MEMORY": float(int(PROCESS_FOOTPRINT_BYTES + 3.0 * tower_weights))}
    assert basis.startswith("estimated: 1.00 GiB + 3 x ") and basis.endswith(" GiB of float32 weights")
    # A QDQ graph reads no tensors itself: its source's weights size it.
    assert task_resources(project.artifact("q"), None)[0] == resources
    # A recorded peak above the estimate wins, with a margin.
    recorded, basis = task_resources(project.artifact("t"), Cost(10.0, 1.0, 8 << 30, LOCK_SOURCE))
    assert recorded == {"MEMORY": float(10 << 30)}
    assert basis == "recorded peak 8.00 GiB in the lock file, plus 25%"
    # device: cuda asks for a GPU.
    assert task_resources(project.artifact("s"), None)[0]["GPU"] == 1.0


def _elements(shape: tuple[int, ...]) -> int:
    count = 1
    for extent in shape:
        count *= extent
    return count


def test_without_a_remote_cache_nothing_is_submitted(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    result = project_dir.doit("build", "--dask", "tcp://127.0.0.1:9", env={"EDGEBUILD_REMOTE_CACHE": "off"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "edgebuild: error: --dask: cluster workers hand their builds back through the remote cache, and none is set: "
        "set EDGEBUILD_REMOTE_CACHE (or the manifest's remote_cache) to a location every worker can reach "
        "(a shared directory, s3://bucket/prefix)"
    )
    assert not (project_dir.root / "build").exists()


EXPECTED_ADDRESS = ("expected 'local', 'local:N' (N worker processes) or a scheduler's address "
                    "such as tcp://host:8786 (tcp, tls, ws, wss or ucx)")


@pytest.mark.parametrize("address, message", [
    ("local:x", f"--dask 'local:x': {EXPECTED_ADDRESS}"),
    ("local: 2", f"--dask 'local: 2': {EXPECTED_ADDRESS}"),
    ("local:", f"--dask 'local:': {EXPECTED_ADDRESS}"),
    ("local:0", "--dask local:0: expected 1 to 256 local workers, found 0"),
    ("udp://127.0.0.1:8786", f"--dask udp://127.0.0.1:8786: udp:// is not a Dask transport; {EXPECTED_ADDRESS}"),
    ("tcp://[::1", f"--dask 'tcp://[::1': {EXPECTED_ADDRESS}"),
    ("file:///etc/passwd", f"--dask 'file:///etc/passwd': {EXPECTED_ADDRESS}"),
    ("tcp://127.0.0.1:70000", f"--dask tcp://127.0.0.1:70000: port 70000 is not 1 to 65535; {EXPECTED_ADDRESS}"),
])
def test_a_malformed_address_is_one_line_even_with_nothing_to_build(project_dir: ProjectDir, address: str,
                                                                     message: str) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    # An empty shard: nothing needs the cluster, and the address is still checked.
    result = project_dir.doit("build", "--shard", "2/2", "--dask", address, env={"EDGEBUILD_REMOTE_CACHE": "off"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"edgebuild: error: {message}"
    assert not (project_dir.root / "build").exists()


def test_a_well_formed_address_is_taken() -> None:
    from edgebuild.run.executors.dask import local_worker_count

    assert local_worker_count("local:3") == 3
    for address in ("tcp://127.0.0.1:8786", "127.0.0.1:8786", "tcp://[::1]:8786", "tls://scheduler.example.com:8786"):
        assert local_worker_count(address) is None


def test_a_read_only_or_missing_remote_cache_is_refused(project_dir: ProjectDir, tmp_path: Path) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    remote = tmp_path / "remote"
    remote.mkdir()
    readonly = project_dir.doit("build", "--remote-readonly", "--dask", "tcp://127.0.0.1:9", env={"EDGEBUILD_REMOTE_CACHE": str(remote)})
    assert readonly.returncode == 2
    assert f"edgebuild: error: --dask: the remote cache {remote} is read-only" in readonly.stderr
    missing = project_dir.doit("build", "--dask", "tcp://127.0.0.1:9", env={"EDGEBUILD_REMOTE_CACHE": str(tmp_path / "nowhere")})
    assert missing.returncode == 2
    nowhere = tmp_path / "nowhere"
    assert missing.stderr.splitlines()[-1] == (
        f"edgebuild: error: EDGEBUILD_REMOTE_CACHE={nowhere}: no such directory; create it (mkdir -p {nowhere}) or mount "
        "the shared disk") and "Traceback" not in missing.stderr


@pytest.mark.slow
def test_an_unreachable_scheduler_is_one_line(project_dir: ProjectDir, tmp_path: Path) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    remote = tmp_path / "remote"
    remote.mkdir()
    started = time.monotonic()
    result = project_dir.doit("build", "--dask", f"tcp://127.0.0.1:{free_port()}", env={"EDGEBUILD_REMOTE_CACHE": str(remote)})
    assert result.returncode == 2
    assert re.search(r"edgebuild: error: --dask tcp://127\.0\.0\.1:\d+: cannot reach a Dask scheduler there within 15 s", result.stderr)
    assert "Traceback" not in result.stderr and time.monotonic() - started < 120


# --- a real cluster ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_build_over_two_workers(two_workers: Cluster, verified_seed: Path, tmp_path: Path, keys: dict[str, Path]) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    driver = clone_project(verified_seed, tmp_path / "driver")
    for name in ("build", "cache"):
        # A driver that has built nothing: everything comes back from the workers.
        shutil.rmtree(driver.root / name)
    driver.manifest(THREE)
    # The driver trusts the workers' key: what they verified and signed counts as verified.
    result = driver.doit("verify", "--dask", two_workers.address,
                         env={"EDGEBUILD_REMOTE_CACHE": str(remote), "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub"})
    output = result.stderr
    assert result.returncode == 0, result.stdout + output
    assert "3 artifacts to build and verify (t, u, q)" in output
    # Which artifact runs where: t and u at once, one on each worker; q after t.
    workers = {name: set(re.findall(rf"  \[{name} @ (tcp://127\.0\.0\.1:\d+)\] started", output)) for name in "tuq"}
    assert workers["t"] | workers["u"] == {two_workers.worker_address("w1"), two_workers.worker_address("w2")}, output
    assert output.index("[q @ ") > output.index("[t @ ")
    # q's worker got its source t from the remote cache (or had built it itself).
    assert re.search(r"  \[q @ \S+\] (\[t\] pulled from the remote cache|\[t\] up to date)", output), output
    assert "cluster: 3 of 3 built and verified" in output
    # The driver exported nothing and judged nothing: it pulled what the workers verified,
    # with their reports, and its verify tasks were up to date.
    for name in "tuq":
        assert f"  [{name}] pulled from the remote cache {remote} in " in output
        assert f"-- verify:{name}\n" in result.stdout
        assert f"  [{name}] built in" not in output
    # The same bytes as the seed's own build of t on this machine.
    assert outputs_of(driver.root, "t") == outputs_of(verified_seed, "t")
    lock = json.loads((driver.root / "artifacts.lock").read_text())["artifacts"]
    assert {name: entry["verified"] for name, entry in lock.items()} == {"t": True, "u": True, "q": True}


@pytest.mark.slow
def test_resources_no_worker_has_are_an_error_not_a_hang(two_workers: Cluster, tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    project = ProjectDir(tmp_path / "p")
    project.manifest(TOWER_MANIFEST)
    # History says t peaked at 64 GiB (a full-size build, say): no worker offers that.
    (project.root / "artifacts.lock").write_text(
        render_lock({"t": {"cost": {"build_seconds": 120.0, "verify_seconds": 30.0, "peak_rss_bytes": 64 << 30}}})
    )
    remote = tmp_path / "remote"
    remote.mkdir()
    started = time.monotonic()
    result = project.doit("build", "--dask", two_workers.address, env={"EDGEBUILD_REMOTE_CACHE": str(remote)})
    assert time.monotonic() - started < 120
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "edgebuild: error: t: no worker of the cluster offers the resources it needs (MEMORY=8.59e+10; MEMORY recorded "
        "peak 64.00 GiB in the lock file, plus 25%): MEMORY=8.59e+10 needed, at most 4e+09 offered; start a worker "
        "with --resources \"MEMORY=8.59e+10\" (or more); nothing was submitted"
    )
    assert not (project.root / "build" / "t").exists()


def _read_until(stream, pattern: str, seen: list[str], timeout: float) -> threading.Thread:
    """Read ``stream`` line by line into ``seen``, to its end, on a thread; return once a
    line matches ``pattern`` (the thread goes on reading)."""
    found = threading.Event()

    def read() -> None:
        for line in iter(stream.readline, ""):
            seen.append(line)
            if re.search(pattern, line):
                found.set()
        found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    found.wait(timeout)
    assert any(re.search(pattern, line) for line in seen), f"no line matching {pattern!r} within {timeout} s:\n{''.join(seen)}"
    return reader


def _cluster_and_unbuilt_driver(verified_seed: Path, tmp_path: Path) -> tuple[Cluster, ProjectDir, Path]:
    """A cluster to start, a remote directory, and a copy of the seed with nothing built or stored."""
    cluster = Cluster(tmp_path / "cluster")
    (tmp_path / "cluster").mkdir()
    remote = tmp_path / "remote"
    remote.mkdir()
    driver = clone_project(verified_seed, tmp_path / "driver")
    shutil.rmtree(driver.root / "build")
    shutil.rmtree(driver.root / "cache" / "store")
    return cluster, driver, remote


def _stalled_driver(cluster: Cluster, driver: ProjectDir, remote: Path) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    """``doit verify --dask`` at ``cluster``, once its build of ``t`` stalls (the worker
    runs with the fault ``build.before_record=stall``): its process, the stderr lines
    read so far, and the thread reading the rest."""
    environment = {key: value for key, value in os.environ.items() if key != "EDGEBUILD_MANIFEST"}
    environment["EDGEBUILD_REMOTE_CACHE"] = str(remote)
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("doit")), "verify", "--dask", cluster.address],
        cwd=driver.root, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen: list[str] = []
    try:
        reader = _read_until(process.stderr, r"\[t @ \S+\] fault: stalling at build\.before_record", seen, timeout=300)
    except BaseException:
        process.kill()
        raise
    return process, seen, reader


@pytest.mark.slow
@pytest.mark.workflow
@pytest.mark.parametrize("retry", [True, False], ids=["retried-elsewhere", "given-up"])
def test_a_worker_killed_in_the_middle_of_a_build(verified_seed: Path, tmp_path: Path, retry: bool) -> None:
    """Worker w1 hangs before its build's record is written; it is killed. With another
    worker the scheduler runs the build again there and the driver gets the same bytes;
    with retries exhausted the artifact is reported by name and nothing counts as built."""
    cluster, driver, remote = _cluster_and_unbuilt_driver(verified_seed, tmp_path)
    try:
        cluster.start_scheduler({} if retry else {"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"})
        cluster.start_worker("w1", "4e9", {"EDGEBUILD_FAULT": "build.before_record=stall"})
        process, seen, reader = _stalled_driver(cluster, driver, remote)
        try:
            # Built but not recorded, not verified, not pushed: nothing anyone could count as built.
            assert not (remote / "v1" / "entries").exists()
            if retry:
                cluster.start_worker("w2", "3e9")
            w1 = cluster.worker_address("w1")
            cluster.kill("w1")
            process.wait(timeout=400)
            reader.join(timeout=30)
            stdout = process.stdout.read()
        finally:
            if process.poll() is None:
                process.kill()
        output = "".join(seen)
    finally:
        cluster.stop()
    if retry:
        assert process.returncode == 0, stdout + output
        w2 = cluster.worker_address("w2")
        # The driver names the next worker when the restart reaches it first, and says
        # "another worker" when it notices the loss first (which comes first is timing).
        assert re.search(
            rf"^  \[t\] worker {re.escape(w1)} was lost while it ran; the scheduler runs it again on "
            rf"({re.escape(w2)} |another worker if it may )",
            output, re.MULTILINE,
        ), output
        assert f"  [t @ {w2}] started" in output
        assert "cluster: 1 of 1 built and verified" in output
        # The retried build gave the same bytes as the seed's.
        assert outputs_of(driver.root, "t") == outputs_of(verified_seed, "t")
        assert RemoteCache.open(str(remote)).has(driver.project().artifact("t").fingerprint)
        assert "verify: 1 passed, 0 failed, 0 not run" in stdout
    else:
        assert process.returncode == 1, stdout + output
        assert (
            f"edgebuild: error: t: every Dask worker that ran it was lost (the scheduler's allowed-failures ran out; "
            f"last on {w1}); nothing of it counts as built"
        ) in output
        assert not (driver.root / "build" / "t").exists()
        assert not (remote / "v1" / "entries").exists()
        # Counted as failed in verify's summary, although doit never ran it here.
        assert "verify: 0 passed, 1 failed (t), 0 not run" in stdout


@pytest.mark.slow
@pytest.mark.workflow
def test_a_local_cluster(verified_seed: Path, tmp_path: Path) -> None:
    """``--dask local:1``: a LocalCluster on loopback, closed when the command ends."""
    remote = tmp_path / "remote"
    remote.mkdir()
    driver = clone_project(verified_seed, tmp_path / "driver")
    driver.manifest(TOWER_MANIFEST + "  u:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 96\n")
    result = driver.doit("build", "--dask", "local:1", env={"EDGEBUILD_REMOTE_CACHE": str(remote)})
    assert result.returncode == 0, result.stdout + result.stderr
    # t was verified here already: pushed, no cluster time; u is built and verified on the cluster.
    assert "[t] remote cache: pushed" in result.stderr
    assert re.search(r"cluster local:1 \(tcp://127\.0\.0\.1:\d+\): 1 artifacts to build and verify \(u\)", result.stderr)
    assert re.search(r"  \[u @ tcp://127\.0\.0\.1:\d+\] started", result.stderr)
    assert "cluster: 1 of 1 built and verified" in result.stderr
    assert f"  [u] pulled from the remote cache {remote} in " in result.stderr
    assert (driver.root / "build" / "u" / "model.onnx").is_file()
    # The local workers' stderr is this terminal: each line of the job comes once, through
    # the driver (with the worker's address), and the report's table not at all.
    assert len(re.findall(r"\] built in ", result.stderr)) == 1, result.stderr
    assert "| check |" not in result.stderr


@pytest.mark.slow
@pytest.mark.workflow
def test_the_scheduler_killed_in_the_middle_of_a_build(verified_seed: Path, tmp_path: Path) -> None:
    """The scheduler dies while its worker builds: one line naming what was not built, in
    bounded time, no traceback; nothing of it counts as built here."""
    cluster, driver, remote = _cluster_and_unbuilt_driver(verified_seed, tmp_path)
    try:
        cluster.start_scheduler()
        cluster.start_worker("w1", "4e9", {"EDGEBUILD_FAULT": "build.before_record=stall"})
        process, seen, reader = _stalled_driver(cluster, driver, remote)
        try:
            started = time.monotonic()
            cluster.kill("scheduler")
            process.wait(timeout=120)
            assert time.monotonic() - started < 120
            reader.join(timeout=30)
            stdout = process.stdout.read()
        finally:
            if process.poll() is None:
                process.kill()
        output = "".join(seen)
    finally:
        cluster.stop()
    assert process.returncode == 2, stdout + output
    assert "Traceback" not in output and "FuturesCancelledError" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"edgebuild: error: --dask {cluster.address}: lost the connection to the scheduler"), output
    assert last.endswith("; not built: t (nothing of it counts as built; run the command again)"), output
    assert not (driver.root / "build" / "t").exists()
