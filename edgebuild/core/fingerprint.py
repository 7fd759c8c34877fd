"""Hashes of files, of byte ranges inside files, and of code.

doit's own checker hashes whole files and trusts an unchanged mtime without
looking at the size. Here a file is identified by (device, inode, size,
mtime_ns, ctime_ns): while that tuple is unchanged its bytes are never read
again; when it changes (a ``touch``), the bytes are hashed once and the new
tuple is remembered (the stat cache, ``statcache.py``). Checkpoints are hashed per tensor byte range, so a kind
that reads 1 GB of a 50 GB shard hashes 1 GB, and a change to ``lm_head`` in
the same shard does not touch the tower's fingerprint.
"""

from __future__ import annotations

import ast
import mmap
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

import blake3

from edgebuild.core.files import open_regular
from edgebuild.core.hashing import digest_bytes

# How far ahead of the hashing position the kernel is asked to read.
READ_AHEAD = 256 * 1024 * 1024
# Bytes per read of coalesced spans. Small enough that a block is still in the CPU's
# cache when it is hashed right after the copy: hashing the tower from a warm page
# cache cost 0.40 s of CPU with 4 MiB blocks, 0.41 s with 8, 0.43 s with 16 and 0.48 s
# with 32. Smaller costs more again: 0.58-0.71 s with 2 MiB, cold, against 0.50 s.
READ_BLOCK = 4 * 1024 * 1024
# Buffers the reader thread may fill ahead of the hasher; the kernel reads further ahead
# (READ_AHEAD). Few, because a buffer's first fill is slow: faulting in 32 MiB of fresh
# memory took 40-60 ms on the development machine.
READ_DEPTH = 3
# Spans at least this large are hashed on blake3's own threads (every core): on one thread,
# hashing is slower than a fast disk reads. Smaller ones are not worth a hand-off between
# threads (221 of the tower's 333 tensors are under 64 KiB: 0.1% of its bytes).
MULTITHREAD_SPAN = 1024 * 1024
# Hashing less than this is quick enough that progress lines would only be noise.
PROGRESS_THRESHOLD = 256 * 1024 * 1024
# numba and llvmlite compile the F143 kernels: a new code generator could round differently.
TOOL_PACKAGES = ("torch", "transformers", "onnx", "onnxruntime", "onnxscript", "safetensors", "numba", "llvmlite")


def _stat_key(stat: os.stat_result) -> list[int]:
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def _hash_ranges(path: Path, spans: list[tuple[int, int]], label: str) -> Iterator[tuple[tuple[int, int], str]]:
    """Digest each span, reading the file's bytes once, with reading and hashing overlapped.

    Spans are coalesced into contiguous extents, read in blocks of READ_BLOCK bytes by a
    background thread (``os.preadv`` releases the GIL), and each block is hashed here,
    one slice per span it holds (blake3's ``update`` releases the GIL too). Every span
    gets its own blake3 hasher fed its bytes in order: the digest is blake3 of the span.
    Reading each tensor on its own (221 of the tower's 333 are under 64 KiB), and
    hashing on one thread, kept a cold fingerprint of the tower at about 40% of ``dd``'s
    throughput on the same bytes.
    """
    pending = sorted(set(spans))
    for span in pending:
        if span[0] == span[1]:
            yield span, blake3.blake3().hexdigest()
    pending = [span for span in pending if span[0] < span[1]]
    total = sum(end - start for start, end in pending)
    show_progress = total >= PROGRESS_THRESHOLD
    done = 0
    started = last_report = time.monotonic()
    handle = open_regular(path)
    descriptor = handle.fileno()
    blocks = _BlockReader(descriptor, _extents(pending), path)
    hashing: list[tuple[tuple[int, int], Any]] = []
    upcoming = 0
    try:
        while upcoming < len(pending) or hashing:
            offset, view, count, release = blocks.next()
            block_end = offset + count
            while upcoming < len(pending) and pending[upcoming][0] < block_end:
                start, end = pending[upcoming]
                threads = blake3.blake3.AUTO if end - start >= MULTITHREAD_SPAN else 1
                hashing.append((pending[upcoming], blake3.blake3(max_threads=threads)))
                upcoming += 1
            for (start, end), hasher in hashing:
                low, high = max(start, offset), min(end, block_end)
                if low < high:
                    hasher.update(view[low - offset : high - offset])
            release()
            finished = [(span, hasher) for span, hasher in hashing if span[1] <= block_end]
            hashing = [(span, hasher) for span, hasher in hashing if span[1] > block_end]
            for span, hasher in finished:
                yield span, hasher.hexdigest()
            done += count
            now = time.monotonic()
            if show_progress and now - last_report >= 1.0:
                rate = done / (now - started) / 1e6
                print(
                    f"  hashing {label}: {done / 2**30:.2f} / {total / 2**30:.2f} GiB ({rate:.0f} MB/s)",
                    file=sys.stderr,
                    flush=True,
                )
                last_report = now
    finally:
        blocks.close()
        handle.close()


def _extents(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of sorted, non-empty ``spans`` as disjoint ``[start, end)`` ranges, in order:
    tensors stored back to back are read as one range, and overlapping spans once."""
    extents: list[tuple[int, int]] = []
    for start, end in spans:
        if extents and start <= extents[-1][1]:
            extents[-1] = (extents[-1][0], max(extents[-1][1], end))
        else:
            extents.append((start, end))
    return extents


class _BlockReader:
    """Reads ``extents`` of a file in order, in blocks of at most READ_BLOCK bytes, on a
    background thread, READ_DEPTH buffers ahead of the consumer."""

    def __init__(self, descriptor: int, extents: list[tuple[int, int]], path: Path) -> None:
        import queue
        import threading

        self._free: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        for _ in range(READ_DEPTH):
            # Anonymous memory is faulted in by the reader's first fill, on its thread while
            # the disk is already busy; a bytearray is zeroed here, before the first read.
            self._free.put(memoryview(mmap.mmap(-1, READ_BLOCK)))
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(descriptor, extents, path), daemon=True)
        self._thread.start()

    def _run(self, descriptor: int, extents: list[tuple[int, int]], path: Path) -> None:
        advised = 0
        try:
            for index, (start, end) in enumerate(extents):
                offset = start
                while offset < end:
                    if offset + READ_AHEAD > advised:
                        advised = _advise_ahead(descriptor, extents, index, offset, advised)
                    buffer = self._free.get()
                    if self._stop:
                        return
                    count = os.preadv(descriptor, [buffer[: min(READ_BLOCK, end - offset)]], offset)
                    if count == 0:
                        raise OSError(f"{path}: file ended at byte {offset}, expected {end}")
                    self._ready.put((offset, buffer, count))
                    offset += count
        except BaseException as error:  # handed to the consumer, which raises it
            self._ready.put((0, error, 0))

    def next(self) -> tuple[int, memoryview, int, Any]:
        """The next block: its file offset, its buffer, how many bytes of it were read, and
        the function that hands the buffer back for reuse."""
        offset, buffer, count = self._ready.get()
        if isinstance(buffer, BaseException):
            raise buffer
        return offset, buffer, count, lambda: self._free.put(buffer)

    def close(self) -> None:
        self._stop = True
        self._free.put(memoryview(bytearray(0)))
        self._thread.join(timeout=5)


def _advise_ahead(descriptor: int, extents: list[tuple[int, int]], index: int, offset: int, advised: int) -> int:
    """Ask the kernel for the next READ_AHEAD bytes of the extents from ``offset`` on (past
    what was already asked for); return how far was advised."""
    budget = READ_AHEAD
    position = max(offset, advised)
    for start, end in extents[index:]:
        if end <= position:
            continue
        begin = max(start, position)
        length = min(end - begin, budget)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(descriptor, begin, length, os.POSIX_FADV_WILLNEED)
        budget -= length
        position = begin + length
        if budget <= 0:
            break
    return position


# --- code and tool versions ---------------------------------------------------

_CODE_CACHE: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, str]] = {}
_ROOTS: dict[str, tuple[Path, ...]] = {}
# Modules no code digest follows: they cannot change an artifact's bytes nor its
# verdict. The package itself (its version string), the error classes (message
# text), phase timing (the record's, never a payload's), and the kind registry and
# the list of built-in kinds (adding a kind must not make the others stale), and the
# cache of float reference outputs (kept by the digest of what computes them and
# checked against the digest of its content on every read: it stores, it decides nothing).
NEUTRAL_MODULES = frozenset(
    {"edgebuild", "edgebuild.errors", "edgebuild.kinds", "edgebuild.core.registry", "edgebuild.core.timing",
     "edgebuild.cache.references",
     # Where a tool that cannot share edgebuild's environment runs; its versions are in the fingerprint.
     "edgebuild.targets.toolenv",
     # What `doit divergence` reads of a runner (module ends): no build's bytes and no verdict
     # follow from it; the divergence's own cache key digests it (run/divergence.py).
     "edgebuild.ml.taps"}
)
# Modules that only re-export: ``from edgebuild.plugin import BuildContext`` is followed
# to the module that defines ``BuildContext``, so what a kind names is digested and
# the rest of the facade is not.
FACADE_MODULES = frozenset({"edgebuild.plugin"})
EDGEBUILD = "edgebuild"


def package_roots(package: str) -> tuple[Path, ...]:
    """Where the top-level package ``package`` lives (its directories; a single-module
    package's file), found from its import spec without importing it."""
    if package not in _ROOTS:
        import importlib.util

        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            roots: tuple[Path, ...] = ()
        elif spec.submodule_search_locations:
            roots = tuple(Path(location).resolve() for location in spec.submodule_search_locations)
        else:
            roots = (Path(spec.origin).resolve(),) if spec.origin else ()
        _ROOTS[package] = roots
    return _ROOTS[package]


def _module_file(module: str) -> Path | None:
    """The source file of ``module`` (a ``.py`` file, or a package's ``__init__.py``)."""
    top, *relative = module.split(".")
    for root in package_roots(top):
        if root.is_file():
            if not relative:
                return root
            continue
        base = root.joinpath(*relative)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def _digest_key(module: str, path: Path) -> str:
    """``path`` as a digest names it: relative to the directory holding its top-level
    package (``edgebuild/core/kind.py``, ``my_plugin/build.py``), so that every machine,
    every checkout path and every install location agree."""
    top = module.split(".")[0]
    for root in package_roots(top):
        try:
            return path.relative_to(root.parent).as_posix()
        except ValueError:
            continue
    return path.name


def _is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


# The fields of a statement that hold statements: an import is a statement, so nothing
# inside an expression need be walked (walking every node made the code digests of the
# built-in kinds 1.5 s of every command's start).
_STATEMENT_FIELDS = ("body", "orelse", "finalbody", "handlers", "cases")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, lazy ones inside functions included, except those under
    ``if TYPE_CHECKING:`` (annotations only: they never run)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if _is_type_checking_block(node):
            pending.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        for field in _STATEMENT_FIELDS:
            children = getattr(node, field, None)
            if isinstance(children, list):
                pending.extend(children)


# Per process, per file: its text and the syntax tree parsed from it. A file is read
# each time (a test, or a long-lived process, may edit it) but parsed once per text:
# the kinds' code walks share most modules.
_PARSED: dict[Path, tuple[str, ast.Module]] = {}


def _parsed(path: Path) -> ast.Module:
    text = path.read_text(encoding="utf-8")
    cached = _PARSED.get(path)
    if cached is None or cached[0] != text:
        cached = _PARSED[path] = (text, ast.parse(text))
    return cached[1]


def _facade_sources(facade: str) -> dict[str, str]:
    """Name -> the module that defines it, for every ``from M import name`` of a facade."""
    path = _module_file(facade)
    if path is None:
        return {}
    sources = {}
    for node in _parsed(path).body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sources[alias.asname or alias.name] = node.module
    return sources


def module_imports(module: str, packages: tuple[str, ...] = (EDGEBUILD,)) -> set[str]:
    """The modules of ``packages`` that ``module`` imports (at run time, lazily or not);
    through a facade, the modules that define the names it is asked for."""
    path = _module_file(module)
    if path is None:
        return set()
    tree = _parsed(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] in packages)
            continue
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1])
            target = f"{base}.{node.module}" if node.module else base
        else:
            target = node.module or ""
        if target.split(".")[0] not in packages:
            continue
        if target in FACADE_MODULES:
            sources = _facade_sources(target)
            found.update(sources.get(alias.name, target) for alias in node.names)
            continue
        submodules = {f"{target}.{alias.name}" for alias in node.names if _module_file(f"{target}.{alias.name}")}
        found.update(submodules)
        # ``from . import f143`` names a module; ``from .x import name`` an attribute of x.
        if len(submodules) < len(node.names):
            found.add(target)
    found = {name for name in found if name.split(".")[0] in packages}
    # A facade imported whole (``import edgebuild.plugin``): everything it re-exports.
    for facade in found & FACADE_MODULES:
        found.discard(facade)
        found.update(source for source in _facade_sources(facade).values() if source.split(".")[0] in packages)
    return {name for name in found if _module_file(name) is not None}


def code_digests(*roots: str, packages: tuple[str, ...] = (EDGEBUILD,)) -> dict[str, str]:
    """Digest of every source file of ``packages`` that the ``roots`` modules import,
    transitively (lazy imports inside functions included: they are found in the syntax
    tree), except through :data:`NEUTRAL_MODULES`; keyed by package-relative path."""
    key = (roots, packages)
    if key in _CODE_CACHE:
        return _CODE_CACHE[key]
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        current = pending.pop()
        if current in seen or current in NEUTRAL_MODULES:
            continue
        seen.add(current)
        pending.extend(module_imports(current, packages))
    digests = {}
    for name in sorted(seen):
        path = _module_file(name)
        if path is not None:
            digests[_digest_key(name, path)] = digest_bytes(path.read_bytes())
    _CODE_CACHE[key] = dict(sorted(digests.items()))
    return _CODE_CACHE[key]


def kind_code_packages(kind: Any) -> tuple[str, ...]:
    """The packages a kind's code digests follow: edgebuild, the packages its build and
    verify modules are in (a plugin's own), and its ``code_packages``."""
    tops = {EDGEBUILD, kind.build_module.split(".")[0], kind.verify_module.split(".")[0], *kind.code_packages}
    return tuple(sorted(tops))


# Per process: reading a distribution's version scans sys.path (about 1 ms a package),
# once per artifact that was 10 s of a 10,000-artifact `doit status`. A forked child
# (a worker from a shared fork server that outlived a `pip install`) starts empty.
_VERSIONS_CACHE: dict[tuple[str, ...], dict[str, str]] = {}
os.register_at_fork(after_in_child=_VERSIONS_CACHE.clear)


def tool_versions(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """Versions of :data:`TOOL_PACKAGES`, and of a kind's ``extra`` tool packages (the
    QNN SDK for a QNN context, a plugin kind's own distribution): a tool only one kind
    uses is in only its fingerprints, so upgrading it rebuilds nothing else."""
    if extra not in _VERSIONS_CACHE:
        _VERSIONS_CACHE[extra] = _read_tool_versions(extra)
    return dict(_VERSIONS_CACHE[extra])


def known_code_and_versions(roots: tuple[str, ...], packages: tuple[str, ...], extra: tuple[str, ...]) -> bool:
    """Whether :func:`code_digests` and :func:`tool_versions` would answer from memory."""
    return (roots, packages) in _CODE_CACHE and extra in _VERSIONS_CACHE


def _read_tool_versions(extra: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for package in (*TOOL_PACKAGES, *extra):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    versions["python"] = ".".join(map(str, sys.version_info[:3]))
    return versions
