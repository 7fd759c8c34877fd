"""The stat cache: digests of byte ranges of files, kept while a file's stat is unchanged.

A file is identified by (device, inode, size, mtime_ns, ctime_ns); while that tuple is
unchanged its bytes are never read again (``fingerprint.py`` says why that tuple).

Kept in SQLite (``cache/statcache.sqlite``), one row per file, as pydoit's and DVC's
state is: a process reads a file's row when the file's stat is new to it, and saving
writes only the rows it changed, so the cost of saving a task does not grow with the
number of files the cache holds. The JSON file it replaces was read, merged and
rewritten whole at every save, under a lock: quadratic over a large build (issue 40).
WAL mode lets readers go on while one process writes; writers (the processes of
``doit -n``, two commands at once) take turns, each waiting 2 s at most (``BUSY_SECONDS``).

It is a cache, and no command depends on it. A damaged file (not a database, a table
gone, another format) is said in one line and started afresh (the files it described
are hashed again). A file that cannot be used -- read-only, on a full disk, locked by
another process for over 2 s, a link (never written through) or a FIFO in its place --
is said in one line naming it and what is wrong (``cache/statcache.sqlite: read-only:
digests taken afresh and not kept``), once per command, and the command answers as it
would otherwise: from then on the process hashes what it reads afresh and keeps the
digests in memory only (:meth:`StatCache.save` never raises). Its format number is the
file's ``PRAGMA user_version``. The JSON file of earlier versions
(``cache/statcache.json``, format 1) is taken over the first time a
command opens the cache, then deleted.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from stat import S_ISREG
from typing import Any, Callable, Iterable, Iterator

from edgebuild.core.console import say_once
from edgebuild.core.files import CACHE_BYTES, IrregularFile, UnreadableFile, describe_entry, locked, parse_json, read_json
from edgebuild.core.fingerprint import _hash_ranges, _stat_key
from edgebuild.core.hashing import HASH_NAME, is_digest

# PRAGMA user_version of the file; the JSON file before it was format 1.
STAT_CACHE_FORMAT = 2
# How long a process waits for another's write to finish before it goes on without the
# file: a write is a few rows (milliseconds), so a lock held this long is held by
# something else (a process hung holding it, someone's `sqlite3` shell), and hashing the
# files again costs less than waiting on it. It was a minute: `doit status` stood
# silent that long, then failed.
BUSY_SECONDS = 2.0
# Largest entry read back (its ranges and named digests, as JSON): the ranges of a shard
# of 100,000 tensors take about 10 MB. A longer one is read as absent (hashed again).
ENTRY_BYTES = 64 << 20

_SCHEMA = (
    # stat: the file's stat tuple as JSON, matched as text; digests: {"ranges": {"START-END":
    # digest}, "named": {algorithm: digest}}.
    "CREATE TABLE IF NOT EXISTS files (path BLOB PRIMARY KEY, stat TEXT NOT NULL, digests TEXT NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
)

# Connections a forked child inherited from its parent (doit -n forks its processes).
# SQLite says not to carry a connection across fork(): the child's copy believes it holds
# what the parent held, and closing it could act on that (a checkpoint, the WAL file
# deleted under the parent). The child opens its own and keeps these, unused, until it exits.
_INHERITED: list[sqlite3.Connection] = []

Entry = dict[str, Any]

# A file changed within this long before its bytes were read is "racily clean" (git's
# word): a second write in the same tick of the file system's clock, of the same size,
# would leave its stat tuple as it was, and the digest of the first bytes would be taken
# for the second. Its digest is kept by the process that read it but not saved: the
# next command reads the file again. Linux stamps files from a coarse clock
# (a tick: up to 10 ms behind the fine one) unless it has multigrain timestamps (6.13+);
# file systems that keep whole seconds get two of them.
RACY_NS = 50_000_000
RACY_NS_WHOLE_SECONDS = 2_000_000_000


def racily_clean(stat: list[int], read_at_ns: int) -> bool:
    """Whether a file of stat tuple ``stat`` (``_stat_key``) read from ``read_at_ns`` on
    (``time.time_ns()``) could have been written again since with the same tuple."""
    changed = max(stat[3], stat[4])
    whole_seconds = stat[3] % 1_000_000_000 == 0 and stat[4] % 1_000_000_000 == 0
    return read_at_ns - changed < (RACY_NS_WHOLE_SECONDS if whole_seconds else RACY_NS)


def _valid_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("stat"), list)
        and isinstance(entry.get("ranges"), dict)
        and all(isinstance(span, str) and is_digest(digest) for span, digest in entry["ranges"].items())
        and isinstance(entry.get("named", {}), dict)
        and all(isinstance(name, str) and isinstance(digest, str) for name, digest in entry.get("named", {}).items())
    )


def _entry_of_row(stat: list[int], digests: str) -> Entry | None:
    """The entry a row holds for a file at ``stat``, or ``None`` for a row of another shape
    (hashed again). Nesting is not checked: the row's length is bounded (``ENTRY_BYTES``)."""
    try:
        parsed = parse_json(digests, max_depth=None)
    except UnreadableFile:
        return None
    if not isinstance(parsed, dict):
        return None
    entry = {"stat": stat, "ranges": parsed.get("ranges"), "named": parsed.get("named", {})}
    return entry if _valid_entry(entry) else None


def _stat_text(stat: list[int]) -> str:
    return json.dumps(stat)


def _row_of(key: str, entry: Entry) -> tuple[bytes, str, str]:
    digests = {"ranges": entry["ranges"], "named": entry.get("named", {})}
    return os.fsencode(key), _stat_text(entry["stat"]), json.dumps(digests, sort_keys=True)


class _Damaged(Exception):
    """The file is not a stat cache SQLite can read (not a database, malformed, another format)."""


class StatCache:
    """Digests of byte ranges of files, valid while the file's stat tuple is unchanged.

    A file's row is read when the file is looked up and nothing here is known of it at
    its current stat; :meth:`save` writes the rows this process changed, merged with what
    another process saved for the same file at the same stat.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        # Entries looked up or made here.
        self.known: dict[str, Entry] = {}
        self.dirty: set[str] = set()
        self.bytes_hashed = 0
        # Rows this object wrote, in all its saves.
        self.rows_written = 0
        self._connection: sqlite3.Connection | None = None
        self._pid = 0
        # Why this process no longer uses the file (said once), or ``None``.
        self.unusable: str | None = None

    @property
    def legacy_path(self) -> Path:
        """Where the JSON stat cache (format 1) of earlier versions was, beside this file."""
        return self.path.with_name("statcache.json")

    # --- looking up ---------------------------------------------------------------------

    def range_digests(self, path: Path, ranges: Iterable[tuple[int, int]], label: str | None = None) -> dict[tuple[int, int], str]:
        """Digest of each ``[start, end)`` range of ``path``, reading only the ranges not cached."""
        path, key, entry = self._entry(path)
        wanted = sorted(set(ranges))
        cached = entry["ranges"]
        missing = [span for span in wanted if f"{span[0]}-{span[1]}" not in cached]
        if missing:
            read_at = time.time_ns()
            for span, digest in _hash_ranges(path, missing, label or path.name):
                cached[f"{span[0]}-{span[1]}"] = digest
                self.bytes_hashed += span[1] - span[0]
            if not self._kept(path, key, entry, read_at):
                return self.range_digests(path, wanted, label)
        return {span: cached[f"{span[0]}-{span[1]}"] for span in wanted}

    def file_digest(self, path: Path) -> str:
        size = os.stat(path).st_size
        return self.range_digests(path, [(0, size)])[(0, size)]

    def named_digest(self, path: Path, algorithm: str, compute: Callable[[], str]) -> str:
        """Another digest of the whole of ``path`` (a Hub blob's sha256, ...), computed by
        ``compute`` once and kept while the file's stat is unchanged."""
        path, key, entry = self._entry(path)
        named = entry.setdefault("named", {})
        if algorithm not in named:
            read_at = time.time_ns()
            digest = compute()
            self.bytes_hashed += path.stat().st_size
            named[algorithm] = digest
            if not self._kept(path, key, entry, read_at):
                return self.named_digest(path, algorithm, compute)
        return named[algorithm]

    def _kept(self, path: Path, key: str, entry: Entry, read_at: int) -> bool:
        """After ``entry`` took digests of bytes read from ``read_at`` on: ``False``, and the
        entry forgotten, when the file changed meanwhile (nothing is cached under its new
        stat); else the entry is to be saved, unless the file is racily clean (RACY_NS)."""
        if _stat_key(os.stat(path)) != entry["stat"]:
            del self.known[key]
            self.dirty.discard(key)
            return False
        if racily_clean(entry["stat"], read_at):
            entry["racy"] = True
        self.dirty.add(key)
        return True

    def remember(self, path: Path, digest: str) -> None:
        """Take ``digest`` as the digest of the whole of ``path`` as it is now: for a
        file just written from, or checked against, bytes of that digest (an output
        renamed into place), so that the next check does not read it again."""
        path = Path(path).resolve()
        stat = os.stat(path)
        self.known[str(path)] = {"stat": _stat_key(stat), "ranges": {f"0-{stat.st_size}": digest}}
        self.dirty.add(str(path))

    def _entry(self, path: Path) -> tuple[Path, str, Entry]:
        """``path`` resolved, its key, and its entry: the one known here while the file's
        stat is unchanged; else the file's row, when it was saved at the file's stat now
        (by another process: a worker that wrote the file, a command run meanwhile); else a
        fresh, empty one. So the process that started a worker reads the rows of the
        outputs the worker wrote as it checks them, and no others."""
        path = Path(path).resolve()
        key = str(path)
        stat = _stat_key(os.stat(path))
        entry = self.known.get(key)
        if entry is not None and entry["stat"] == stat:
            return path, key, entry
        entry = self._read(key, stat) or {"stat": stat, "ranges": {}}
        self.known[key] = entry
        return path, key, entry

    def _read(self, key: str, stat: list[int]) -> Entry | None:
        """The row of ``key``, when it was saved at ``stat`` (a row of another stat is not
        even read)."""
        rows = self._query("SELECT digests FROM files WHERE path = ? AND stat = ? AND length(digests) <= ?",
                           (os.fsencode(key), _stat_text(stat), ENTRY_BYTES))
        return _entry_of_row(stat, rows[0][0]) if rows else None

    def _query(self, sql: str, parameters: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Rows of a read; none where there is no file yet, or it cannot be used (said once)."""
        for attempt in range(2):
            if self.unusable is not None:
                return []
            try:
                return _when_not_busy(lambda: self._read_rows(sql, parameters))
            except (_Damaged, sqlite3.Error, OSError, UnreadableFile) as error:
                if _is_damage(error) and not attempt:
                    self._start_afresh(str(error))
                    continue
                self._go_on_without(error)
        return []

    def _read_rows(self, sql: str, parameters: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        connection = self._connect(create=False)
        return [] if connection is None else connection.execute(sql, parameters).fetchall()

    # --- saving -------------------------------------------------------------------------

    def save(self) -> None:
        """Write the entries changed here, one row each: merged, for a file at the same stat,
        with what another process saved since. Where the file cannot be written, said in
        one line (once), and the entries stay with this process: never raises."""
        for attempt in range(2):
            if not self.dirty or self.unusable is not None:
                break
            try:
                _when_not_busy(lambda: self._write(self._connect(create=True)))
                break
            except (_Damaged, sqlite3.Error, OSError, UnreadableFile) as error:
                if _is_damage(error) and not attempt:
                    self._start_afresh(str(error))
                    continue
                self._go_on_without(error)
        self.dirty.clear()

    def _write(self, connection: sqlite3.Connection) -> None:
        # A racily clean file's digests stay with this process (RACY_NS).
        keys = sorted(key for key in self.dirty if key in self.known and not self.known[key].get("racy"))
        with _write_transaction(connection):
            for key in keys:
                entry = self.known[key]
                stored = connection.execute("SELECT digests FROM files WHERE path = ? AND stat = ? AND length(digests) <= ?",
                                            (os.fsencode(key), _stat_text(entry["stat"]), ENTRY_BYTES)).fetchall()
                theirs = _entry_of_row(entry["stat"], stored[0][0]) if stored else None
                if theirs is not None:
                    # The same bytes: another process's ranges are as good as ours.
                    entry["ranges"] = {**theirs["ranges"], **entry["ranges"]}
                    entry["named"] = {**theirs["named"], **entry.get("named", {})}
                connection.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?)", _row_of(key, entry))
        self.rows_written += len(keys)

    # --- the file -----------------------------------------------------------------------

    def _connect(self, create: bool) -> sqlite3.Connection | None:
        """This process's connection; ``None`` when there is no file and ``create`` is false.
        Raises :class:`_Damaged` for a file that is no stat cache of this format."""
        if self._connection is not None and self._pid == os.getpid():
            return self._connection
        if self._connection is not None:
            _INHERITED.append(self._connection)
            self._connection = None
        if not create and not os.path.lexists(self.path) and not os.path.lexists(self.legacy_path):
            return None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):
            # SQLite follows a link, dangling or not, and writes the database (and its
            # journal) where it points: outside the project. Never written through a link.
            linked = Path(f"{self.path}{suffix}")
            if linked.is_symlink():
                which = f"its {suffix[1:]} file, {linked.name}, is " if suffix else ""
                raise IrregularFile(linked, f"{which}a symbolic link (to {os.readlink(linked)}); the stat cache is "
                                            "never written through a link: remove it")
        # A FIFO, a device or a directory in its place is one line (SQLite would wait on a
        # FIFO, or say only "unable to open database file"). Looked at, never opened here:
        # closing a descriptor of the file drops every lock this process's connections hold.
        try:
            mode = os.stat(self.path).st_mode
        except FileNotFoundError:
            pass
        else:
            if not S_ISREG(mode):
                raise IrregularFile(self.path, f"{describe_entry(self.path, mode)}, not a regular file")
        connection = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None, check_same_thread=False)
        try:
            self._prepare(connection)
        except BaseException:
            connection.close()
            raise
        self._connection, self._pid = connection, os.getpid()
        self._migrate(connection)
        return connection

    @staticmethod
    def _prepare(connection: sqlite3.Connection) -> None:
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(BUSY_SECONDS * 1000)}")
            # NORMAL: a commit is not synced until the next checkpoint. A power cut may lose
            # the last few saves; for a cache that only means hashing those files again.
            connection.execute("PRAGMA synchronous = NORMAL")
            if connection.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                connection.execute("PRAGMA journal_mode = WAL")
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                with _write_transaction(connection):
                    for statement in _SCHEMA:
                        connection.execute(statement)
                    connection.execute("INSERT OR IGNORE INTO meta VALUES ('hash', ?)", (HASH_NAME,))
                    connection.execute(f"PRAGMA user_version = {STAT_CACHE_FORMAT}")
            elif version != STAT_CACHE_FORMAT:
                raise _Damaged(f"format {version}, this version reads format {STAT_CACHE_FORMAT}")
            hashed = connection.execute("SELECT value FROM meta WHERE name = 'hash'").fetchone()
            if hashed is None or hashed[0] != HASH_NAME:
                raise _Damaged(f"digests of {hashed[0] if hashed else 'no named hash'}, not {HASH_NAME}")
            # A table dropped or altered (by hand, by a tool) at this format number: asked
            # here, else every read and every save would meet it again.
            connection.execute("SELECT path, stat, digests FROM files LIMIT 0").fetchall()
        except sqlite3.OperationalError as error:
            if "no such table" in str(error) or "no such column" in str(error):
                raise _Damaged(str(error)) from None
            raise
        except sqlite3.DatabaseError as error:
            raise _Damaged(str(error)) from None

    def _migrate(self, connection: sqlite3.Connection) -> None:
        """The JSON stat cache of earlier versions (format 1), if any: its entries taken into
        this file (a row saved here already wins), then it is deleted. In a write
        transaction, so that of processes starting at once one reads it and the others
        find it gone."""
        legacy = self.legacy_path
        if not os.path.lexists(legacy):
            return
        with _write_transaction(connection):
            files = self._legacy_files(legacy)
            if files is not None:
                connection.executemany("INSERT OR IGNORE INTO files VALUES (?, ?, ?)",
                                       [_row_of(key, entry) for key, entry in files.items() if _valid_entry(entry)])
            legacy.unlink(missing_ok=True)
            legacy.with_suffix(".lock").unlink(missing_ok=True)

    def _legacy_files(self, legacy: Path) -> dict[str, Any] | None:
        """The entries of the JSON stat cache ``legacy``; ``None`` where there is none to
        take (gone, or unreadable: said in one line)."""
        try:
            data = read_json(legacy, CACHE_BYTES)
        except FileNotFoundError:
            return None
        except (OSError, UnreadableFile) as error:
            self._say(f"the stat cache of the earlier version, {legacy.name}, is unreadable ({_reason(error)}); deleted")
            return None
        files = data.get("files") if isinstance(data, dict) and data.get("hash") == HASH_NAME else None
        if not isinstance(files, dict):
            self._say(f"the stat cache of the earlier version, {legacy.name}, is not one this version reads; deleted")
            return None
        return files

    def _start_afresh(self, reason: str) -> None:
        """A damaged file: deleted and created again, said in one line. Under a lock, so that
        of two processes that found it damaged, the second neither deletes the first's new
        file nor says it again. One that cannot be deleted is gone on without."""
        self._disconnect()
        try:
            with locked(self.path.with_name(self.path.name + ".lock")):
                try:
                    connection = sqlite3.connect(self.path, timeout=BUSY_SECONDS, isolation_level=None)
                    try:
                        self._prepare(connection)
                        connection.execute("SELECT count(*) FROM files").fetchone()
                        return
                    finally:
                        connection.close()
                except (_Damaged, sqlite3.DatabaseError):
                    pass
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        except OSError as error:
            self._go_on_without(error, f"damaged ({reason}) and cannot be started afresh")
            return
        self._say(f"damaged stat cache ({reason}); started afresh, the files it described are hashed again")

    def _go_on_without(self, error: BaseException, problem: str | None = None) -> None:
        """This process stops using the file: said once, in one line naming what is wrong;
        what it has looked up stays in memory, what it reads from now on is hashed afresh."""
        self.unusable = problem or _problem(error)
        self._disconnect()
        self._say(f"{self.unusable}: digests taken afresh and not kept")

    def _disconnect(self) -> None:
        if self._connection is not None:
            if self._pid == os.getpid():
                self._connection.close()
            else:
                _INHERITED.append(self._connection)
            self._connection = None

    def _say(self, message: str) -> None:
        say_once(f"{self.path}: {message}")


def _when_not_busy(action: Callable[[], Any]) -> Any:
    """``action``, tried again while SQLite says the file is busy without having waited
    itself, up to ``BUSY_SECONDS`` in all. SQLite waits on a lock another writer holds,
    but not in every case (it answers at once where waiting could deadlock, and around a
    WAL file's recovery): ``test_two_processes_saving_at_once_lose_no_entry`` once got
    "database is locked" under load, with a 60 s busy timeout set."""
    deadline = time.monotonic() + BUSY_SECONDS
    pause = 0.001
    while True:
        try:
            return action()
        except sqlite3.OperationalError as error:
            busy = getattr(error, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


@contextmanager
def _write_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """A write transaction, the write lock taken at its start (IMMEDIATE): a reader that
    would write later cannot deadlock with another writer; other writers wait for it."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def _is_damage(error: BaseException) -> bool:
    """Whether ``error`` says the file is no stat cache (not a database, malformed, another
    format), rather than that it cannot be opened, or is busy, now."""
    if isinstance(error, _Damaged):
        return True
    return isinstance(error, sqlite3.DatabaseError) and not isinstance(error, sqlite3.OperationalError)


def _reason(error: BaseException) -> str:
    return str(error.strerror) if isinstance(error, OSError) and error.strerror else str(error)


def _problem(error: BaseException) -> str:
    """What is wrong with the file, as the one line says it: read-only, full, locked, ..."""
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    number = error.errno if isinstance(error, OSError) else None
    if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return f"locked by another process for over {BUSY_SECONDS:g} s"
    if primary == sqlite3.SQLITE_READONLY:
        return "read-only"
    if number in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"read-only ({_reason(error)})"
    if primary == sqlite3.SQLITE_FULL or number in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return f"no room to write ({_reason(error)})"
    if code == sqlite3.SQLITE_IOERR_WRITE:
        # What a write past ``ulimit -f`` gets too (EFBIG), and a full disk at some offsets.
        return f"cannot be written ({_reason(error)})"
    if isinstance(error, IrregularFile):
        return _reason(error)
    return f"cannot be used ({_reason(error)})"
