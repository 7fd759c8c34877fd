"""What reaches the terminal: edgebuild's own lines always; the libraries' chatter
only when asked (``EDGEBUILD_VERBOSE=1``, or ``-v 2`` given to a doit command: the
``verbose`` setting).

torch's exporter and the ONNX optimiser log at WARNING about things that are
normal for every export ("Skipping constant folding for op Split with multiple
outputs"); a user reading them looks for a problem that is not there. Errors
still come through.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The exporter, its optimiser and the IR library under it; torchao, which transformers
# imports wherever it is installed, warns on import about GPU kernels a CPU machine does
# not load; torch's pytree about its enums. (A kind adds the libraries its own steps run:
# its ``Process.quiet_loggers``.)
CHATTY_LOGGERS = ("onnxscript", "onnx_ir", "torch.onnx", "torch.export", "torch._export", "torch._dynamo",
                  "torchao", "torch.utils._pytree")
# Packages whose warnings (deprecations, tracer notes) concern their own internals.
CHATTY_PACKAGES = ("torch", "transformers", "onnxscript", "onnx_ir", "onnxruntime", "torchao",
                   # torch's pytree deprecation notes, raised where pickling reconstructs a spec.
                   "copyreg")


class LibraryRootRecords(logging.Filter):
    """Drops what the libraries log below ERROR on the *root* logger (``logging.warning(...)``
    names no logger, so no logger's level can quiet it): a converter's frontend that logs a
    traceback there for every decomposition it does not find, at every conversion."""

    def __init__(self) -> None:
        super().__init__()
        self.packages: set[str] = set(CHATTY_PACKAGES)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        path = record.pathname.replace(os.sep, "/")
        return not any(f"/{package}/" in path for package in self.packages)


_ROOT_FILTER = LibraryRootRecords()


def quiet_logging(libraries: tuple[str, ...] = ()) -> None:
    """The libraries' loggers at ERROR and their warnings ignored, without importing any of
    them (a logger's level holds for the library imported later): what a command's own
    process does first, before a fixture or a check imports transformers. ``libraries``:
    more of them, by logger and package name (a kind's ``Process.quiet_loggers``)."""
    for name in (*CHATTY_LOGGERS, *libraries):
        logging.getLogger(name).setLevel(logging.ERROR)
    for package in (*CHATTY_PACKAGES, *libraries):
        warnings.filterwarnings("ignore", module=rf"{re.escape(package)}(\..*)?$")
    _ROOT_FILTER.packages.update(libraries)
    logging.getLogger().addFilter(_ROOT_FILTER)  # once: a logger keeps a filter once


def quiet_libraries(verbose: bool = False, libraries: tuple[str, ...] = ()) -> None:
    """Keep the libraries' warnings and log messages below ERROR off the terminal,
    unless ``verbose`` (``Settings.verbose``: ``EDGEBUILD_VERBOSE=1``, ``-v 2``);
    ``libraries``: those a kind's steps run besides edgebuild's own."""
    if verbose:
        return
    quiet_logging(libraries)
    _quiet_onnxruntime()


# Lines native libraries print to a worker's stdout or stderr themselves, past any Python
# logging: an NPU SDK's thread-local note, onnxruntime's own log lines (ANSI-coloured,
# timestamped), onnxruntime's quantizer nagging about pre-processing on the root logger,
# transformers' torchvision fallback. The relay drops them unless ``verbose``.
LIBRARY_NOISE = (
    re.compile(r"^\s*# LIBNATIVE: "),
    re.compile(r"^(\x1b\[[0-9;]*m)?\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \[[VIWE]:onnxruntime:"),
    re.compile(r"^WARNING:root:Please consider (to run )?pre-processing before quantization"),
    re.compile(r"^\[transformers\] `\w+` requires torchvision \(not installed\); falling back to "),
    # Runtimes reading CPU details; TensorFlow Lite's interpreter and converter (absl logging).
    re.compile(r"^\[cpuinfo_utils\.cpp:\d+\] "),
    re.compile(r"^INFO: Created TensorFlow Lite \w+ delegate for CPU\.$"),
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./]+:\d+\] "),
    re.compile(r"^Failed to load \S+/torchao/_C\w*\.\S+\.so: "),
)


def is_library_noise(line: str) -> bool:
    return any(pattern.match(line) for pattern in LIBRARY_NOISE)


def _quiet_onnxruntime() -> None:
    """onnxruntime logs through its own C++ logger, straight to stderr, with ANSI colours:
    constant-folding notes for float16 graphs, execution providers' remarks. Errors only,
    for every session this process opens afterwards."""
    import importlib.util

    if importlib.util.find_spec("onnxruntime") is None:
        return
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)


@contextmanager
def quieted(verbose: bool = False, libraries: tuple[str, ...] = ()) -> Iterator[None]:
    """:func:`quiet_libraries` for the duration of a block, then the logging levels
    and warning filters as they were: for a library call inside someone's program."""
    loggers = {name: logging.getLogger(name).level for name in (*CHATTY_LOGGERS, *libraries)}
    had_root_filter = _ROOT_FILTER in logging.getLogger().filters
    packages = set(_ROOT_FILTER.packages)
    with warnings.catch_warnings():
        quiet_libraries(verbose, libraries)
        try:
            yield
        finally:
            for name, level in loggers.items():
                logging.getLogger(name).setLevel(level)
            _ROOT_FILTER.packages = packages
            if not had_root_filter:
                logging.getLogger().removeFilter(_ROOT_FILTER)


# The lines said once per command (:func:`say_once`), and the worker processes' lines
# their relay passed on (:func:`relayed_once`).
_SAID_ONCE: set[str] = set()
_RELAYED: set[str] = set()


def say_once(message: str) -> None:
    """``message`` as one line on stderr (``edgebuild: message``), unless this process said
    it already, or passed it on from a worker it started: a cache that cannot be written
    is said once per command, not at each of the saves of its processes."""
    import sys

    line = f"edgebuild: {message}\n"
    if line in _SAID_ONCE:
        return
    _SAID_ONCE.add(line)
    if line not in _RELAYED:
        sys.stderr.write(line)
        sys.stderr.flush()


def relayed_once(line: str) -> bool:
    """Whether a worker's stderr ``line`` is to be passed on: not when this process said it
    with :func:`say_once` already; remembered, so that this process does not say it after."""
    if line in _SAID_ONCE:
        return False
    if line.startswith("edgebuild: "):
        _RELAYED.add(line)
    return True


def reader_gone() -> int:
    """The reader of stdout went away (``doit status | head``): stop without a word, as
    other command-line tools do, and return the status to exit with. stdout points at
    ``/dev/null`` from here on: Python's own flush at exit would otherwise fail again and
    print a traceback of its own."""
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 1


def shown_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a message shows it: relative to the cwd when it is below it."""
    try:
        return Path(path).absolute().relative_to(Path.cwd()).as_posix()
    except ValueError:
        return str(path)


def format_size(size: float) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units, as ``--max-size`` reads them)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_age(seconds: float) -> str:
    """``5400`` -> ``1.5 h``: the largest unit that keeps the number at least 1."""
    seconds = max(seconds, 0.0)
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f} {unit}"
    return f"{seconds:.0f} s"


# What must not reach a terminal from a manifest: C0 and C1 control characters (ANSI
# escapes start with ESC, BEL rings) except tab and newline, DEL, and the bidirectional
# controls that make text read otherwise than it is stored. One pattern, for the loader
# and the manifest's JSON Schema alike.
TERMINAL_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
TERMINAL_SAFE_PATTERN = f"^[^{TERMINAL_UNSAFE}]*$"
_UNSAFE = re.compile(f"[{TERMINAL_UNSAFE}]")


def terminal_unsafe(text: str) -> str | None:
    """What in ``text`` a terminal would act on instead of showing (an escape, a bell, a
    bidi override), in words; ``None`` when there is nothing."""
    found = _UNSAFE.search(text)
    if found is None:
        return None
    character = found.group()
    return f"the control character U+{ord(character):04X} at offset {found.start()}"
