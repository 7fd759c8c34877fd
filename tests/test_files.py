"""Every file edgebuild reads back is read bounded: a regular file only, at most so many
bytes, JSON of bounded nesting. A device, a FIFO, a directory or a huge file where a
manifest, lock file, record, report or cache belongs is one line naming the file, in
bounded time and memory, and nothing is written."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.files import MAX_JSON_DEPTH, UnreadableFile, parse_json, read_bytes, read_json
from edgebuild.core.fingerprint import StatCache
from edgebuild.core.report import read_report
from edgebuild.errors import LockfileError, RecordError
from edgebuild.core.lockfile import read_lock
from edgebuild.core.record import read_record

from helpers import TOWER_MANIFEST, ProjectDir, pretend_built

# A command that reads a hostile file must stay far below this (the /dev/zero manifest
# grew to 23.9 GB before the kernel killed it).
ADDRESS_SPACE_LIMIT = 2 << 30
SECONDS = 60


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def doit(project_dir: ProjectDir, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``doit args`` bounded in memory and time: a read that is not bounded fails the test
    instead of taking the machine down."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("EDGEBUILD_")} | (env or {})
    return subprocess.run([str(Path(sys.executable).with_name("doit")), *args], cwd=project_dir.root, env=environment,
                          capture_output=True, text=True, timeout=SECONDS, preexec_fn=limited)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- the reader ------------------------------------------------------------------------


def test_read_bytes_refuses_what_is_not_a_regular_file_or_too_large(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    for path, message in [(Path("/dev/zero"), "a character device, not a regular file"),
                          (fifo, "a FIFO (named pipe), not a regular file"),
                          (tmp_path, "a directory, not a regular file"),
                          (big, "1001 B, more than the 1000 B a file of this kind may hold")]:
        with pytest.raises(UnreadableFile) as caught:
            read_bytes(path, 1000)
        assert str(caught.value) == message
    assert read_bytes(big, 1001) == b"x" * 1001
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "absent", 10)


def test_json_nesting_is_bounded(tmp_path: Path) -> None:
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH) is not None
    with pytest.raises(UnreadableFile) as caught:
        parse_json("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert str(caught.value) == f"JSON nested more than {MAX_JSON_DEPTH} levels deep"
    # Deeper than the parser's own recursion: the same kind of error, not a RecursionError.
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000)
    with pytest.raises(UnreadableFile) as caught:
        read_json(path, 1 << 20)
    assert str(caught.value) == "not valid JSON: nested too deeply"
    with pytest.raises(UnreadableFile) as caught:
        parse_json(b"\xff")
    assert str(caught.value).startswith("not valid JSON")


def test_each_state_file_reader_bounds_what_it_reads(tmp_path: Path) -> None:
    (tmp_path / "artifacts.lock").mkdir()
    with pytest.raises(LockfileError) as caught:
        read_lock(tmp_path / "artifacts.lock")
    assert "artifacts.lock: a directory, not a regular file; expected a JSON lock file" in str(caught.value)

    record_dir = tmp_path / "build" / "t"
    record_dir.mkdir(parents=True)
    os.mkfifo(record_dir / ".edgebuild.json")
    with pytest.raises(RecordError) as caught:
        read_record(record_dir)
    assert str(caught.value).endswith(".edgebuild.json: not a build record (a FIFO (named pipe), not a regular file)")

    report_dir = tmp_path / "report"
    report_dir.mkdir()
    (report_dir / "report.json").write_text("[" * 200_000)
    assert read_report(report_dir) is None  # unreadable: not verified
    deep: list = []
    for _ in range(MAX_JSON_DEPTH + 5):
        deep = [deep]
    (report_dir / "report.json").write_text(json.dumps({"format": 1, "deep": deep}))
    assert read_report(report_dir) is None

    cache = tmp_path / "statcache.json"
    cache.write_text("[" * 200_000)
    assert StatCache(cache).entries == {}  # a cache: unreadable is empty, hashed again


# --- through the commands --------------------------------------------------------------


@pytest.mark.parametrize("manifest, found", [
    ("/dev/zero", "a character device, not a regular file"),
    ("/dev/urandom", "a character device, not a regular file"),
    ("fifo.yaml", "a FIFO (named pipe), not a regular file"),
    ("folder.yaml", "a directory, not a regular file"),
])
@pytest.mark.parametrize("command", ["list", "check", "status"])
def test_a_manifest_that_is_not_a_file_is_one_line(project_dir: ProjectDir, manifest: str, found: str,
                                                   command: str) -> None:
    os.mkfifo(project_dir.root / "fifo.yaml")
    (project_dir.root / "folder.yaml").mkdir()
    line = one_line(doit(project_dir, command, env={"EDGEBUILD_MANIFEST": manifest}))
    shown = manifest if manifest.startswith("/") else str(project_dir.root / manifest)
    assert line == f"edgebuild: error: {shown}: cannot read manifest: {found}; expected a YAML file"
    assert sorted(path.name for path in project_dir.root.iterdir()) == ["dodo.py", "fifo.yaml", "folder.yaml"]


def test_a_manifest_too_large_is_one_line(project_dir: ProjectDir) -> None:
    huge = project_dir.root / "artifacts.yaml"
    with open(huge, "wb") as handle:
        handle.truncate(20 << 20)  # sparse: 20 MiB of zeros, no disk
    line = one_line(doit(project_dir, "list"))
    assert line == ("edgebuild: error: artifacts.yaml: cannot read manifest: 20.0 MiB, more than the 16.0 MiB a file "
                    "of this kind may hold; expected a YAML file")


def test_a_lock_file_that_is_a_directory_is_one_line_before_anything_is_built(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    (project_dir.root / "artifacts.lock").mkdir()
    line = one_line(doit(project_dir, "build", env={"EDGEBUILD_REMOTE_CACHE": "off"}))
    assert line == ("ERROR: artifacts.lock: a directory, not a regular file; expected a JSON lock file "
                    "(delete it and run `doit build` to write it afresh)")
    assert not (project_dir.root / "build").exists()


def test_a_report_nested_too_deeply_is_not_verified_not_a_traceback(project_dir: ProjectDir) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    output = project_dir.root / "build" / "t" / "model.onnx"
    output.parent.mkdir(parents=True)
    output.write_bytes(b"graph")
    from edgebuild.core.hashing import file_digest

    pretend_built(project_dir.project(), "t", {"model.onnx": file_digest(output)})
    (output.parent / "report.json").write_text("[" * 200_000)
    (output.parent / "report.md").write_text("# t\n")
    result = doit(project_dir, "report")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    status = doit(project_dir, "status")
    assert status.stdout == "t  up to date (not verified)\n", status.stdout + status.stderr
