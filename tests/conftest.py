"""Shared test fixtures: tiny checkpoints of the real architectures, generated once
per session, and throwaway project directories that run the real doit CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import NOT_INSTALLED, REQUIRE_ALL_TESTS, TOWER_MANIFEST, ProjectDir, made_once


def pytest_configure(config: pytest.Config) -> None:
    """One numba cache for the whole run, shared by every test's project and every process
    (pytest-xdist's workers inherit it): the F143 kernels compile once, not once per
    project. A project's own default (``cache/numba``) is tested with the variable unset."""
    if "NUMBA_CACHE_DIR" not in os.environ:
        import tempfile

        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgebuild-tests-numba-")
        config._edgebuild_numba_cache = os.environ["NUMBA_CACHE_DIR"]  # type: ignore[attr-defined]
    # The hundreds of doit processes the tests start fork their workers from shared
    # servers (one per environment), not each from a server of its own: ~5-9 s less per
    # process. Their sockets live in a directory of the run's; removing it at the end
    # stops them (a server retires when its socket goes), as their idle timeout would.
    # test_forkserver.py tests the per-process servers too (the default on CI).
    if "EDGEBUILD_FORK_SERVER_DIR" not in os.environ and "EDGEBUILD_FORK_SERVER" not in os.environ:
        import tempfile

        os.environ["EDGEBUILD_FORK_SERVER"] = "shared"
        os.environ["EDGEBUILD_FORK_SERVER_IDLE"] = "120"
        os.environ["EDGEBUILD_FORK_SERVER_DIR"] = tempfile.mkdtemp(prefix="edgebuild-tests-forkservers-")
        config._edgebuild_fork_servers = os.environ["EDGEBUILD_FORK_SERVER_DIR"]  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for made in (getattr(config, "_edgebuild_numba_cache", None), getattr(config, "_edgebuild_fork_servers", None)):
        if made:
            shutil.rmtree(made, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under ``EDGEBUILD_REQUIRE_ALL_TESTS=1`` (CI), a skip for want of what the test set-up
    installs (helpers.missing) is a failure: a green run then means every such test ran. A
    skip for what no set-up installs (a reflink filesystem, a platform's wheel) stays a skip."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get(REQUIRE_ALL_TESTS) != "1" or not isinstance(report.longrepr, tuple):
        return
    path, line, reason = report.longrepr
    if NOT_INSTALLED in reason:
        report.outcome = "failed"
        report.longrepr = (f"{path}:{line}: {reason.removeprefix('Skipped: ')}; {REQUIRE_ALL_TESTS}=1 makes this a "
                           "failure, not a skip (unset it to skip)")


@pytest.fixture(scope="session", autouse=True)
def _generated_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every fixture's checkpoint at its default config, generated once for the run when a
    test first lays out a project that names one (a run of tests that lay out none does not
    wait for them): the projects start with copies (``helpers.with_generated_checkpoints``)."""
    import functools

    import helpers

    def make(directory: Path) -> None:
        from edgebuild.core.fixtures import ensure_fixture
        from edgebuild.core.registry import fixtures

        for name in fixtures():
            ensure_fixture(directory, name)

    helpers.generated_checkpoints = functools.cache(
        lambda: made_once(tmp_path_factory, "generated-checkpoints", make) / "fixtures")


@pytest.fixture(autouse=True)
def _no_ambient_remote(monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote cache or keys set in the developer's environment are never used by a test
    (nor by the doit processes tests start): a test names its own."""
    for variable in ("EDGEBUILD_REMOTE_CACHE", "EDGEBUILD_SIGNING_KEY", "EDGEBUILD_TRUSTED_KEYS"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture(scope="session")
def qwen_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgebuild.core.fixtures import write_fixture

    return made_once(tmp_path_factory, "qwen", lambda directory: write_fixture(directory / "ckpt", "qwen3_5_vl_tiny")) / "ckpt"


@pytest.fixture
def project_dir(tmp_path: Path) -> ProjectDir:
    return ProjectDir(tmp_path)


# --- a verified artifact to share, and remotes to share it through -------------------

@pytest.fixture(scope="session")
def verified_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project whose one artifact ``t`` (the tiny tower at 64x64) is built and
    verified, with no remote: exported once per session, copied by tests."""
    def make(directory: Path) -> None:
        seed = ProjectDir(directory)
        seed.manifest(TOWER_MANIFEST)
        result = seed.doit("verify", env={"EDGEBUILD_REMOTE_CACHE": "off"})
        assert result.returncode == 0, result.stdout + result.stderr

    return made_once(tmp_path_factory, "seed", make)


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory):
    """A real S3 API (moto's server mode) on 127.0.0.1 at a free port, for the session."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("moto") / "server.log"
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log, stderr=subprocess.STDOUT, env=_s3_environment(os.environ, endpoint),
        )
    try:
        _wait_until_serving(endpoint, process, log_path)
        _S3_LOGS[endpoint] = log_path
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# Each loopback S3 server's log (its request lines), by endpoint.
_S3_LOGS: dict[str, Path] = {}


@pytest.fixture
def s3_requests(s3_endpoint: str) -> Callable[[str], list[str]]:
    """``requests(text)``: the requests the loopback S3 server has logged so far whose line
    holds ``text`` (a key, a fingerprint), as ``"METHOD /path"``."""
    import re

    log_path = _S3_LOGS[s3_endpoint]

    def requests(text: str) -> list[str]:
        found = re.findall(r'"([A-Z]+ \S+) HTTP/[0-9.]+"', log_path.read_text(errors="replace"))
        return [request for request in found if text in request]

    return requests


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point every S3 client of this process and its children at the loopback server,
    with dummy credentials and nothing read from the user's AWS configuration."""
    for key, value in _s3_environment(os.environ, s3_endpoint).items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    for key in [key for key in os.environ if key.startswith("AWS_") and key not in _S3_VARIABLES]:
        monkeypatch.delenv(key)
    return s3_endpoint


@pytest.fixture
def s3_bucket(s3_env: str) -> str:
    """A fresh, empty bucket: ``s3://<name>``."""
    import uuid

    import fsspec

    name = f"edgebuild-test-{uuid.uuid4().hex[:12]}"
    filesystem = fsspec.filesystem("s3", endpoint_url=s3_env, skip_instance_cache=True)
    filesystem.mkdir(name)
    return f"s3://{name}"


@pytest.fixture(params=["directory", "s3"])
def remote_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A remote location of each kind: a local directory, and a prefix in an S3 bucket."""
    if request.param == "directory":
        return str(tmp_path / "remote")
    return request.getfixturevalue("s3_bucket") + "/team/edgebuild"


_S3_VARIABLES = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never ask an instance-metadata service for anything.
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def _s3_environment(base: dict[str, str], endpoint: str) -> dict[str, str]:
    environment = dict(_S3_VARIABLES)
    environment["EDGEBUILD_S3_ENDPOINT_URL"] = endpoint
    # Loopback traffic must not go through a proxy the machine may have configured.
    for key in ("NO_PROXY", "no_proxy"):
        existing = [part for part in base.get(key, "").split(",") if part]
        environment[key] = ",".join(dict.fromkeys([*existing, "127.0.0.1", "localhost"]))
    return environment | {key: value for key, value in base.items() if key not in environment and not key.startswith("AWS_")}


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_serving(endpoint: str, process: subprocess.Popen, log_path: Path) -> None:
    import time
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the moto server exited with {process.returncode}:\n{log_path.read_text()}")
        try:
            opener.open(f"{endpoint}/moto-api/", timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"the moto server did not answer at {endpoint} within 60 s:\n{log_path.read_text()}")


@pytest.fixture(scope="session")
def siglip_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgebuild.core.fixtures import write_fixture

    return made_once(tmp_path_factory, "siglip", lambda directory: write_fixture(directory / "ckpt", "siglip_tiny")) / "ckpt"


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two key pairs, as ``python -m edgebuild keygen`` writes them: the team's and another's."""
    def make(directory: Path) -> None:
        for name in ("team", "other"):
            made = subprocess.run([sys.executable, "-m", "edgebuild", "keygen", str(directory / name)],
                                  capture_output=True, text=True, timeout=120)
            assert made.returncode == 0, made.stderr

    directory = made_once(tmp_path_factory, "keys", make)
    return {name: directory / name for name in ("team", "other")}
