"""edgebuild's settings: the one place that reads and writes ``EDGEBUILD_*`` variables.

A :class:`Settings` is a typed value, made once per process from the environment
(:meth:`Settings.from_environ`) and then handed down: the command-line options of
a doit command replace some of its fields (:meth:`Settings.replace`), a
:class:`~edgebuild.run.workspace.Workspace` keeps its own, and the Python API
takes one per project, so two projects with different remote caches share one
process. Settings become environment variables again only at a process boundary
(:meth:`Settings.environ`): the worker processes that build and verify, doit's
``-n`` processes, a cluster's jobs.

:data:`VARIABLES` is the table of every variable, its field and what it means:
the reference documentation is generated from it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgebuild.errors import ConfigError

# ``EDGEBUILD_<TOOL>_PYTHON``: one variable per tool environment (a kind declares those).
TOOL = "<TOOL>"
_TOOL_PYTHON = re.compile(r"EDGEBUILD_([A-Z0-9]+(?:_[A-Z0-9]+)*)_PYTHON")
# How long a tool environment's Python may take to say its packages' versions (50 ms in a
# made one): a program that hung there held `doit status` for minutes.
TOOL_PROBE_SECONDS = 5.0
# ``EDGEBUILD_REMOTE_CACHE=off``: no remote cache, whatever the manifest says.
REMOTE_CACHE_OFF = "off"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, the :class:`Settings` field it sets, its type
    (``path``, ``paths``, ``location``, ``switch``, ``count``, ``seconds``, ``text``, or
    ``tool paths``: one variable per tool, the tool's name in its own) and what it does."""

    name: str
    field: str
    type: str
    help: str


VARIABLES = (
    Variable("EDGEBUILD_MANIFEST", "manifest", "path",
             "The manifest to use (default: artifacts.yaml in the current directory)."),
    Variable("EDGEBUILD_REMOTE_CACHE", "remote_cache", "location",
             "A shared cache of verified builds: a directory or an fsspec URL (s3://bucket/prefix); overrides the "
             "manifest's remote_cache; 'off' disables it."),
    Variable("EDGEBUILD_REMOTE_CACHE_READONLY", "remote_readonly", "switch",
             "Pull from the remote cache, never push to it (pull requests). Same as --remote-readonly."),
    Variable("EDGEBUILD_PULL_ONLY", "pull_only", "switch",
             "Export nothing: every artifact comes from the store or the remote cache, or it is an error "
             "(a gather step). Same as --pull-only."),
    Variable("EDGEBUILD_FROZEN", "frozen", "switch",
             "Take every fingerprint from the lock file as committed at HEAD and pull by it: no checkpoint is read, "
             "nothing is exported or judged here (a gather or publish runner). Same as --frozen."),
    Variable("EDGEBUILD_SIGNING_KEY", "signing_key", "path",
             "A private key (python -m edgebuild keygen PREFIX writes PREFIX.key) that signs every entry this "
             "runner pushes to the remote cache; its public key is trusted too."),
    Variable("EDGEBUILD_TRUSTED_KEYS", "trusted_keys", "paths",
             "Public keys, comma-separated (PREFIX.pub): a pulled build whose entry one of them signed counts as "
             "verified; any other pulled build is verified here first."),
    Variable("EDGEBUILD_VERBOSE", "verbose", "switch",
             "Show the libraries' warnings and log lines (torch's exporter, onnxruntime), hidden by default. "
             "Same as -v 2."),
    Variable("EDGEBUILD_JOBS", "jobs", "count",
             "How many builds share this machine's cores (doit -n N sets it): each takes cores / N torch threads."),
    Variable("EDGEBUILD_S3_ENDPOINT_URL", "s3_endpoint", "text",
             "The endpoint of an S3-compatible server (MinIO, Ceph) for s3:// locations."),
    Variable("EDGEBUILD_CLUSTER_WAIT", "cluster_wait_seconds", "seconds",
             "How long --dask waits for a worker to join, or for one that offers what a waiting job needs "
             "(default 60)."),
    Variable(f"EDGEBUILD_{TOOL}_PYTHON", "tool_pythons", "tool paths",
             "The Python of the environment of its own that a kind's tool runs in, for a tool that cannot share "
             "edgebuild's (default: .venv-<tool> beside the environment edgebuild runs in, as python -m edgebuild "
             "toolenv TOOL makes it; python -m edgebuild toolenv --list lists the tools). It must be an executable "
             f"file that says its packages' versions within {TOOL_PROBE_SECONDS:g} s when asked (they go into the "
             "fingerprints): one that does not is stopped, and its kind's artifacts are an error in one line."),
    Variable("EDGEBUILD_RETRY_REJECTED", "retry_rejected", "switch",
             "Try again a build its target's tool refused at the same fingerprint (a QNN compile that failed), "
             "instead of repeating the failure the store remembers."),
    Variable("EDGEBUILD_JOB_OUTPUT_TO_WORKER_LOG", "job_output_to_worker_log", "switch",
             "Whether a cluster job's output also goes to the cluster worker's own log (default on; a local "
             "cluster turns it off, its workers share the driver's terminal)."),
)
_BY_FIELD = {variable.field: variable for variable in VARIABLES}


@dataclass(frozen=True)
class Settings:
    """What the environment (or the caller) says about how to run. Paths are absolute:
    a relative one is taken relative to the directory it was read in, before doit changes
    into the dodo file's directory."""

    manifest: str | None = None
    # ``None``: the manifest's ``remote_cache``; ``"off"``: none at all.
    remote_cache: str | None = None
    remote_readonly: bool = False
    pull_only: bool = False
    frozen: bool = False
    signing_key: str | None = None
    # Absolute paths, comma-separated (as the variable has them).
    trusted_keys: str | None = None
    verbose: bool = False
    jobs: int = 0
    s3_endpoint: str | None = None
    cluster_wait_seconds: float = 60.0
    # Tool environment name -> the Python named for it, absolute (``EDGEBUILD_<TOOL>_PYTHON``).
    tool_pythons: tuple[tuple[str, str], ...] = ()
    job_output_to_worker_log: bool = True
    retry_rejected: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> "Settings":
        """The settings ``environ`` (default: this process's environment) holds. A value of
        the wrong shape is a :class:`~edgebuild.errors.ConfigError` naming the variable."""
        environ = os.environ if environ is None else environ
        check_process_switches(environ)
        values: dict[str, Any] = {}
        for variable in VARIABLES:
            if variable.type == "tool paths":
                found = {match.group(1).lower(): _absolute(text, cwd) for key, text in environ.items()
                         if text and (match := _TOOL_PYTHON.fullmatch(key))}
                values[variable.field] = tuple(sorted(found.items()))
                continue
            text = environ.get(variable.name)
            if text is None or (text == "" and variable.type != "switch"):
                continue
            values[variable.field] = _parse(variable, text, cwd)
        return cls(**values)

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)

    def environ(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with every ``EDGEBUILD_*`` variable
        saying these settings: set where a field differs from its default, removed where it
        does not, so that a child process reads exactly these settings back."""
        environment = dict(os.environ if base is None else base)
        self.apply(environment)
        return environment

    def apply(self, environ: MutableMapping[str, str]) -> None:
        """Write these settings into ``environ`` (see :meth:`environ`)."""
        defaults = Settings()
        for variable in VARIABLES:
            value = getattr(self, variable.field)
            if variable.type == "tool paths":
                for key in [key for key in environ if _TOOL_PYTHON.fullmatch(key)]:
                    del environ[key]
                environ.update({f"EDGEBUILD_{tool.upper()}_PYTHON": path for tool, path in value})
                continue
            if value == getattr(defaults, variable.field):
                environ.pop(variable.name, None)
            else:
                environ[variable.name] = _format(value)

    def tool_python(self, tool: str) -> str | None:
        """The Python ``EDGEBUILD_<TOOL>_PYTHON`` names for tool environment ``tool``, if any."""
        return dict(self.tool_pythons).get(tool)

    @property
    def remote_cache_disabled(self) -> bool:
        return self.remote_cache == REMOTE_CACHE_OFF

    @property
    def trusted_key_paths(self) -> list[str]:
        return [path for path in (self.trusted_keys or "").split(",") if path]


def _parse(variable: Variable, text: str, cwd: Path | None) -> Any:
    if variable.type == "switch":
        value = text.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ConfigError(f"{variable.name}: expected 1 or 0 (on/off, true/false, yes/no), found {text!r}")
    if variable.type == "count":
        if not (text.isascii() and text.strip().isdigit()) or len(text.strip()) > 6:
            raise ConfigError(f"{variable.name}: expected a whole number of at most six digits, found {text!r}")
        return int(text)
    if variable.type == "seconds":
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds <= 86400:
            raise ConfigError(f"{variable.name}: expected a number of seconds from 0 to 86400, found {text!r}")
        return seconds
    if variable.type == "path":
        return _absolute(text, cwd)
    if variable.type == "paths":
        parts = [part.strip() for part in text.split(",")]
        if any(not part for part in parts):
            raise ConfigError(f"{variable.name}: expected paths separated by commas, found an empty one in {text!r}")
        return ",".join(_absolute(part, cwd) for part in parts)
    if variable.type == "location":
        if not text.strip() or any(character in text for character in "\n\r\0"):
            raise ConfigError(f"{variable.name}: expected a directory or a URL (or 'off'), found {text!r}; unset it "
                              "for the manifest's remote_cache")
        return text if text == REMOTE_CACHE_OFF or "://" in text else _absolute(text, cwd)
    return text


def _absolute(text: str, cwd: Path | None) -> str:
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else Path(cwd or os.getcwd()) / path)


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def variable_of(field: str) -> str:
    """The environment variable of a :class:`Settings` field (for messages)."""
    return _BY_FIELD[field].name


# --- process-wide switches that are not settings of a run --------------------------------

FORK_SERVER_VARIABLE = "EDGEBUILD_FORK_SERVER"


FORK_SERVER_IDLE_VARIABLE = "EDGEBUILD_FORK_SERVER_IDLE"
DEFAULT_FORK_SERVER_IDLE_SECONDS = 300.0


def fork_server_mode(environ: Mapping[str, str]) -> str:
    """How workers start (``edgebuild/run/forkserver.py``): ``"shared"``, from a server
    this user's commands share and that outlives them (the default, but on CI:
    ``EDGEBUILD_FORK_SERVER=shared``); ``"process"``, from a server of this command's
    own (the default on CI: ``EDGEBUILD_FORK_SERVER=process``); ``"off"``, each a fresh
    interpreter (``EDGEBUILD_FORK_SERVER=0``).

    Shared is the default because the everyday edit pays the imports otherwise: one
    changed calibration image of the tiny QDQ job takes 6.0 s with a server per command
    and 1.7 s with a shared one (``bench/peers.py``). A CI runner (``CI`` set, as GitHub
    Actions, GitLab and most services set it) runs each command once on a machine that
    is thrown away: a server left behind there would only hold memory."""
    value = environ.get(FORK_SERVER_VARIABLE, "").strip().lower()
    if value in ("0", "false", "no", "off"):
        return "off"
    if value == "shared":
        return "shared"
    # "process", and the on values it was spelled as before there was a shared server.
    if value:
        return "process"
    return "process" if on_ci(environ) else "shared"


def check_process_switches(environ: Mapping[str, str]) -> None:
    """A :class:`~edgebuild.errors.ConfigError` naming the variable for a fork-server switch
    of the wrong shape: read where it acts, deep in a run, a typo would quietly choose
    another way of starting workers, or another idle time."""
    text = environ.get(FORK_SERVER_VARIABLE, "")
    if text.strip().lower() not in ("", "shared", "process", *_TRUE, *_FALSE):
        raise ConfigError(f"{FORK_SERVER_VARIABLE}: expected shared, process or 0 (off), found {text!r}")
    idle = environ.get(FORK_SERVER_IDLE_VARIABLE, "")
    if idle.strip() and _idle_seconds(idle) is None:
        raise ConfigError(f"{FORK_SERVER_IDLE_VARIABLE}: expected a number of seconds above 0, at most 86400, "
                          f"found {idle!r}")


def on_ci(environ: Mapping[str, str]) -> bool:
    """Whether this is a CI runner: ``CI`` set to anything but empty, 0 or false."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no", "off")


def fork_server_idle_seconds(environ: Mapping[str, str]) -> float:
    """How long a shared fork server waits for its next client before it exits
    (``EDGEBUILD_FORK_SERVER_IDLE``, seconds; unset: the default). A command refuses an
    unreadable value when it starts (:func:`check_process_switches`); here it is the default."""
    seconds = _idle_seconds(environ.get(FORK_SERVER_IDLE_VARIABLE, ""))
    return seconds if seconds is not None else DEFAULT_FORK_SERVER_IDLE_SECONDS


def _idle_seconds(text: str) -> float | None:
    """``EDGEBUILD_FORK_SERVER_IDLE``'s seconds, above 0 and at most a day; ``None`` for
    anything else (the one reading both the check and the server go by)."""
    try:
        seconds = float(text)
    except ValueError:
        return None
    return seconds if 0 < seconds <= 86400 else None


FORK_SERVER_DIR_VARIABLE = "EDGEBUILD_FORK_SERVER_DIR"


@dataclass(frozen=True)
class Switch:
    """A process-wide environment variable that is not a setting of a run: read where it
    acts, not through :class:`Settings` (workers inherit it with the environment)."""

    name: str
    type: str
    help: str


PROCESS_SWITCHES = (
    Switch(FORK_SERVER_VARIABLE, "text",
           "How worker processes start: 'shared' (the default, but where CI is set), forked from a fork server this "
           "user's commands share, which has imported torch, transformers and onnxruntime and outlives them (see "
           "Processes in the concepts); 'process' (the default where CI is set), from a fork server of the command's "
           "own; '0' (or off), a fresh interpreter each. Any other value stops the command with one line."),
    Switch(FORK_SERVER_IDLE_VARIABLE, "seconds",
           f"How long a shared fork server waits for its next command before it exits, above 0 and at most 86400 "
           f"(default {DEFAULT_FORK_SERVER_IDLE_SECONDS:.0f})."),
    Switch(FORK_SERVER_DIR_VARIABLE, "path",
           "Where shared fork servers listen (default: edgebuild-forkservers-<uid> in $XDG_RUNTIME_DIR, else in the "
           "temporary directory). It must be the user's own, mode 0700, and short enough for a Unix socket's path; "
           "otherwise each command starts a server of its own."),
)



def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without edgebuild's settings (``EDGEBUILD_*``), but for the process-wide
    switches (:data:`PROCESS_SWITCHES`, how workers start), which are no setting of a run: a
    clean environment made by a test or a tool still forks from the servers its caller
    chose, rather than leave shared ones of its own behind."""
    switches = {switch.name for switch in PROCESS_SWITCHES}
    return {key: value for key, value in environ.items() if not key.startswith("EDGEBUILD_") or key in switches}

FAULT_VARIABLE = "EDGEBUILD_FAULT"
FAULT_STALL_VARIABLE = "EDGEBUILD_FAULT_STALL_SECONDS"


def armed_fault() -> tuple[str, str, float]:
    """The fault point tests arm (``EDGEBUILD_FAULT=<point>=<action>``, see
    ``edgebuild/core/faults.py``): point, action and stall seconds; ``("", "", 600.0)``
    when none is. Read at every fault point: a test arms one for one child process."""
    spec = os.environ.get(FAULT_VARIABLE, "")
    point, _, action = spec.partition("=")
    try:
        stall = float(os.environ.get(FAULT_STALL_VARIABLE, "600"))
    except ValueError:
        stall = 600.0
    return point, action, stall


def prefer_numba_cache(directory: Path) -> None:
    """Keep numba's compiled kernels under ``directory`` unless ``NUMBA_CACHE_DIR`` says
    otherwise. numba caches beside the module by default: a non-editable install's
    site-packages may be read-only, and CI's cache restore looks under ``cache/``. Read
    when numba is first imported (lazily, later), so it must be set before."""
    os.environ.setdefault("NUMBA_CACHE_DIR", str(directory))
