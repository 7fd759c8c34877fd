"""The stat cache's store (issue 40): one SQLite row per file, written per key, shared by
processes that save at once; a damaged file said once and started afresh; the JSON
file of earlier versions taken over."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from edgebuild.core.statcache import RACY_NS, StatCache, racily_clean

from helpers import REPO, seeded_bytes, settle

# Each of two processes saves this many entries, one save per entry (a task's save each).
ENTRIES_PER_PROCESS = 150

CONCURRENT_WRITER = """
import sys, time
from pathlib import Path
from edgebuild.core.statcache import StatCache

cache_path, files, shared, go, which = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
while not go.exists():
    time.sleep(0.001)
for path in sorted(files.glob(f"{which}-*")):
    cache = StatCache(cache_path)
    cache.file_digest(path)
    cache.save()
# Both hash a range of their own of one file: saved at the same stat, the two merge.
cache = StatCache(cache_path)
cache.range_digests(shared, [(which, which + 10)])
cache.save()
"""


def write_files(directory: Path, names: list[str]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, name in enumerate(names):
        path = directory / name
        path.write_bytes(seeded_bytes(64, index))
        paths.append(path)
    settle()
    return paths


def rows(cache_path: Path) -> dict[str, dict]:
    """Each file's saved ranges, read with sqlite3 itself."""
    with sqlite3.connect(cache_path) as connection:
        found = connection.execute("SELECT path, digests FROM files").fetchall()
    return {os.fsdecode(path): json.loads(digests)["ranges"] for path, digests in found}


def test_two_processes_saving_at_once_lose_no_entry(tmp_path: Path) -> None:
    files = tmp_path / "files"
    paths = write_files(files, [f"{which}-{index:03}" for which in (0, 1) for index in range(ENTRIES_PER_PROCESS)])
    shared = write_files(tmp_path, ["shared.bin"])[0]
    cache_path = tmp_path / "cache" / "statcache.sqlite"
    go = tmp_path / "go"
    writers = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT_WRITER, str(cache_path), str(files), str(shared), str(go), str(which)],
                         env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True)
        for which in (0, 1)
    ]
    go.touch()
    for writer in writers:
        _, errors = writer.communicate(timeout=300)
        assert writer.returncode == 0, errors
        assert errors == ""
    saved = rows(cache_path)
    assert sorted(saved) == sorted(str(path.resolve()) for path in [*paths, shared])
    assert sorted(saved[str(shared.resolve())]) == ["0-10", "1-11"]
    reader = StatCache(cache_path)
    for path in paths:
        assert reader.file_digest(path) == blake3.blake3(path.read_bytes()).hexdigest()
    reader.range_digests(shared, [(0, 10), (1, 11)])
    assert reader.bytes_hashed == 0


def _wal_frames(cache_path: Path, page_size: int) -> int:
    wal = Path(f"{cache_path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    # A WAL file: a 32-byte header, then a 24-byte header and a page per frame.
    return max(0, size - 32) // (page_size + 24)


@pytest.mark.parametrize("cached", [100, 3_000])
def test_saving_one_tasks_entries_writes_their_rows_only(tmp_path: Path, cached: int) -> None:
    """What the JSON file could not do: a save writes the pages of the rows it changed,
    whatever else the file holds."""
    paths = write_files(tmp_path / "files", [f"{index:05}" for index in range(cached)])
    cache_path = tmp_path / "statcache.sqlite"
    everything = StatCache(cache_path)
    for path in paths:
        everything.remember(path, blake3.blake3(path.read_bytes()).hexdigest())
    everything.save()
    with sqlite3.connect(cache_path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size, pages = (connection.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_size", "page_count"))
    before = rows(cache_path)

    one_task = StatCache(cache_path)
    task_output = paths[cached // 2]
    task_output.write_bytes(b"rebuilt")
    settle()
    one_task.file_digest(task_output)
    one_task.save()

    assert one_task.rows_written == 1
    # One leaf page, and the pages above it should the leaf have split.
    assert _wal_frames(cache_path, page_size) <= 3, (pages, _wal_frames(cache_path, page_size))
    after = rows(cache_path)
    assert after.pop(str(task_output.resolve())) == {"0-7": blake3.blake3(b"rebuilt").hexdigest()}
    before.pop(str(task_output.resolve()))
    assert after == before
    if cached == 3_000:
        assert pages > 100  # what a whole rewrite would have written


@pytest.mark.parametrize("damage", ["not a database", "pages overwritten"])
def test_a_damaged_cache_is_said_once_and_started_afresh(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         damage: str) -> None:
    paths = write_files(tmp_path / "files", [f"{index:04}" for index in range(400)])
    cache_path = tmp_path / "statcache.sqlite"
    if damage == "not a database":
        cache_path.write_text("edgebuild " * 1000)
    else:
        filled = StatCache(cache_path)
        for path in paths:
            filled.file_digest(path)
        filled.save()
        del filled
        with sqlite3.connect(cache_path) as connection:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = bytearray(cache_path.read_bytes())
        # The schema (page 1) stays; every page of rows is garbage.
        data[4096:] = b"\xa5" * (len(data) - 4096)
        cache_path.write_bytes(bytes(data))
    capsys.readouterr()

    cache = StatCache(cache_path)
    for path in paths[:3]:
        assert cache.file_digest(path) == blake3.blake3(path.read_bytes()).hexdigest()
    cache.save()

    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"edgebuild: {cache_path}: damaged stat cache (")
    assert lines[0].endswith("); started afresh, the files it described are hashed again")
    with sqlite3.connect(cache_path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert sorted(rows(cache_path)) == sorted(str(path.resolve()) for path in paths[:3])
    again = StatCache(cache_path)
    again.file_digest(paths[0])
    assert again.bytes_hashed == 0
    assert capsys.readouterr().err == ""


def test_the_json_cache_of_earlier_versions_is_taken_over_and_deleted(tmp_path: Path) -> None:
    kept, other = write_files(tmp_path / "files", ["kept", "other"])
    legacy = tmp_path / "statcache.json"
    stat = os.stat(kept)
    entry = {"stat": [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns],
             "ranges": {f"0-{stat.st_size}": blake3.blake3(kept.read_bytes()).hexdigest()}}
    legacy.write_text(json.dumps({"format": 1, "hash": "blake3",
                                  "files": {str(kept.resolve()): entry, str(other.resolve()): {"stat": 3}}}))
    cache = StatCache(tmp_path / "statcache.sqlite")
    cache.file_digest(kept)
    assert cache.bytes_hashed == 0
    cache.file_digest(other)
    assert cache.bytes_hashed == other.stat().st_size
    assert not legacy.exists()
    assert sorted(rows(tmp_path / "statcache.sqlite")) == [str(kept.resolve())]


def test_an_unreadable_json_cache_of_earlier_versions_is_said_and_deleted(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    (path,) = write_files(tmp_path / "files", ["a"])
    legacy = tmp_path / "statcache.json"
    legacy.write_text('{"format": 1, "hash"')
    cache = StatCache(tmp_path / "statcache.sqlite")
    cache.file_digest(path)
    assert not legacy.exists()
    assert capsys.readouterr().err == (
        f"edgebuild: {tmp_path / 'statcache.sqlite'}: the stat cache of the earlier version, statcache.json, is "
        "unreadable (not valid JSON: Expecting ':' delimiter: line 1 column 21 (char 20)); deleted\n"
    )


def test_a_file_another_process_wrote_and_saved_is_not_read_again(tmp_path: Path) -> None:
    """The process that starts a worker checked the outputs of an earlier build; the
    worker rewrites them and saves their digests: the parent takes those, reading none
    of the files (and no other row)."""
    output, other = write_files(tmp_path / "build" / "a", ["model.onnx", "unrelated.bin"])
    cache_path = tmp_path / "statcache.sqlite"
    parent = StatCache(cache_path)
    parent.file_digest(output)
    hashed = parent.bytes_hashed

    worker = StatCache(cache_path)
    output.write_bytes(b"the new build")
    worker.remember(output, blake3.blake3(b"the new build").hexdigest())
    worker.file_digest(other)
    worker.save()

    assert parent.file_digest(output) == blake3.blake3(b"the new build").hexdigest()
    assert parent.bytes_hashed == hashed
    assert sorted(parent.known) == [str(output.resolve())]


def test_a_file_rewritten_while_hashed_is_not_cached_under_its_new_stat(tmp_path: Path) -> None:
    (path,) = write_files(tmp_path, ["input.bin"])
    cache = StatCache(tmp_path / "statcache.sqlite")
    rewritten = []

    def hash_then_rewrite() -> str:
        if not rewritten:
            path.write_bytes(b"written while it was read")
            rewritten.append(True)
        return "sha256 of what was read"

    assert cache.named_digest(path, "sha256", hash_then_rewrite) == "sha256 of what was read"
    # Computed again for the new bytes, not kept for the read of the old ones.
    assert cache.known[str(path.resolve())]["stat"][2] == len(b"written while it was read")
    assert rewritten == [True]


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    """doit -n forks its processes after the parent may have opened the cache: the child
    saves through a connection of its own, and the parent's goes on working after the
    child is gone."""
    first, second = write_files(tmp_path / "files", ["parent", "child"])
    cache_path = tmp_path / "statcache.sqlite"
    cache = StatCache(cache_path)
    cache.file_digest(first)
    cache.save()
    inherited = cache._connection
    child = os.fork()
    if child == 0:
        try:
            cache.file_digest(second)
            cache.save()
            os._exit(0 if cache._connection is not inherited else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    first.write_bytes(b"changed in the parent")
    cache.file_digest(first)
    cache.save()
    assert cache._connection is inherited
    assert sorted(rows(cache_path)) == sorted(str(path.resolve()) for path in (first, second))
    with sqlite3.connect(cache_path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_file_read_in_the_tick_it_was_written_is_read_again_by_the_next_command(tmp_path: Path) -> None:
    """A file written again in the same tick of the file system's clock, at the same size,
    keeps its stat tuple (on kernels without multigrain timestamps): a digest of bytes read
    that close to the file's last change is not saved for the next command."""
    path = tmp_path / "config.json"
    cache_path = tmp_path / "statcache.sqlite"
    path.write_bytes(b'{"a": 1}')
    first = StatCache(cache_path)
    digest = first.file_digest(path)
    assert first.file_digest(path) == digest and first.bytes_hashed == 8  # kept by the process that read it
    first.save()
    assert first.rows_written == 0

    settle()
    second = StatCache(cache_path)
    assert second.file_digest(path) == digest and second.bytes_hashed == 8
    second.save()
    assert second.rows_written == 1
    third = StatCache(cache_path)
    third.file_digest(path)
    assert third.bytes_hashed == 0


@pytest.mark.parametrize("mtime, ctime, read_at, racy", [
    (10_000_000_123, 10_000_000_123, 10_000_000_123 + RACY_NS - 1, True),
    (10_000_000_123, 10_000_000_123, 10_000_000_123 + RACY_NS, False),
    # The later of the two: a chmod moves ctime only.
    (10_000_000_123, 20_000_000_123, 20_000_000_124, True),
    # A file system that keeps whole seconds: a tick is a second.
    (10_000_000_000, 10_000_000_000, 11_000_000_000, True),
    (10_000_000_000, 10_000_000_000, 12_000_000_000, False),
])
def test_racily_clean(mtime: int, ctime: int, read_at: int, racy: bool) -> None:
    assert racily_clean([1, 2, 3, mtime, ctime], read_at) is racy
