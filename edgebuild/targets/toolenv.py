"""Tools that live in an environment of their own, because they cannot share edgebuild's.

A kind declares such an environment (``tool_environments``: an
:class:`~edgebuild.core.kind.ToolEnvironment`): a virtual environment beside edgebuild's
(``.venv-<name>``), or the Python ``EDGEBUILD_<NAME>_PYTHON`` names, that holds the
tool; ``python -m edgebuild toolenv NAME`` makes it. The kind runs its tool there as a
script that imports nothing of edgebuild, or in edgebuild's own environment where the
tool imports there too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from edgebuild.core.config import TOOL_PROBE_SECONDS, Settings
from edgebuild.core.kind import ToolEnvironment
from edgebuild.errors import FilesystemError

# (Python, packages) -> the versions it said, or what is wrong with it (a phrase), once a process.
_PROBED: dict[tuple[str, tuple[str, ...]], dict[str, str] | str] = {}


def tool_python(environment: ToolEnvironment, settings: Settings | None = None) -> Path:
    """The Python of ``environment``: the one its variable names, else the default directory
    beside the environment edgebuild runs in (which may not exist)."""
    settings = settings if settings is not None else Settings.from_environ()
    given = settings.tool_python(environment.name)
    if given:
        return Path(given)
    return Path(sys.prefix).parent / environment.directory / "bin" / "python"


def missing_reason(environment: ToolEnvironment, settings: Settings | None = None) -> str | None:
    """Why ``environment`` cannot be used (``None`` when it can): its Python is not there,
    is not an executable file, or does not say its packages' versions within
    :data:`TOOL_PROBE_SECONDS`."""
    settings = settings if settings is not None else Settings.from_environ()
    python = tool_python(environment, settings)
    makes_it = f"python -m edgebuild toolenv {environment.name} makes it (or set {environment.variable})"
    if not python.exists():
        return f"{environment.module} runs in an environment of its own, and there is none at {python}: {makes_it}"
    named = f"{python} ({environment.variable})" if settings.tool_python(environment.name) else str(python)
    if python.is_dir():
        problem = "is a directory; expected an executable file (such as DIR/bin/python)"
    elif not python.is_file():
        problem = "is not a regular file; expected an executable file"
    elif not os.access(python, os.X_OK):
        problem = "is not executable; expected an executable file"
    else:
        probed = _probe(python, environment.versions)
        if isinstance(probed, dict):
            return None
        problem = probed
    return f"{environment.module} runs in an environment of its own, and its Python {named} {problem}: {makes_it}"


def tool_versions(environment: ToolEnvironment, settings: Settings | None = None) -> dict[str, str]:
    """The versions of the environment's packages (``not installed`` where there is none),
    read once a process: they are in the fingerprints of the artifacts it makes."""
    probed = None
    if missing_reason(environment, settings) is None:
        probed = _probe(tool_python(environment, settings), environment.versions)
    found = probed if isinstance(probed, dict) else dict.fromkeys(environment.versions, "not installed")
    return {f"{environment.name}:{package}": version for package, version in found.items()}


def _probe(python: Path, packages: tuple[str, ...]) -> dict[str, str] | str:
    """The versions of ``packages`` that ``python`` says (``not installed`` for those it has
    not), once a process; or what is wrong with it, a phrase ("did not say ..."). In a
    session of its own, so that a program that hangs is killed with everything it started."""
    key = (str(python), packages)
    if key in _PROBED:
        return _PROBED[key]
    script = ("import importlib.metadata as m, json\n"
              f"names = {list(packages)!r}\n"
              "found = {}\nfor n in names:\n    try:\n        found[n] = m.version(n)\n"
              "    except m.PackageNotFoundError:\n        found[n] = 'not installed'\n"
              "print(json.dumps(found))\n")
    try:
        child = subprocess.Popen([str(python), "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as error:
        answer: dict[str, str] | str = f"does not start ({error.strerror or error})"
    else:
        with child:
            try:
                out, err = child.communicate(timeout=TOOL_PROBE_SECONDS)
                answer = _versions_said(out, err, child.returncode, packages)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                answer = (f"did not say its packages' versions within {TOOL_PROBE_SECONDS:g} s, and was stopped; "
                          "expected a Python that answers at once")
    _PROBED[key] = answer
    return answer


def _versions_said(out: str, err: str, status: int, packages: tuple[str, ...]) -> dict[str, str] | str:
    """What a probe's output says: the versions, or what is wrong (a phrase)."""
    if status != 0:
        last = (err.strip().splitlines() or [""])[-1][:200]
        return f"failed to say its packages' versions (exit status {status}{': ' + last if last else ''})"
    try:
        found = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except json.JSONDecodeError:
        found = None
    if not (isinstance(found, dict) and set(found) == set(packages)
            and all(isinstance(version, str) for version in found.values())):
        return f"answered {out.strip()[:80]!r} when asked its packages' versions; expected a Python"
    return found


def make(environment: ToolEnvironment, directory: Path | None = None, log=print) -> Path:
    """Make ``environment`` (a virtual environment with its packages) at ``directory``
    (default: beside edgebuild's environment); return its Python."""
    import venv

    target = directory if directory is not None else Path(sys.prefix).parent / environment.directory
    if target.exists() and not target.is_dir():
        raise FilesystemError(f"toolenv {environment.name}: {target} is not a directory; expected the directory to "
                              "make the environment in (or a path where there is nothing yet)")
    python = target / "bin" / "python"
    if not python.is_file():
        log(f"making {target}")
        venv.EnvBuilder(with_pip=True).create(target)
    log(f"installing {', '.join(environment.packages)} into {target}")
    subprocess.run([str(python), "-m", "pip", "install", "-q", *environment.packages], check=True)
    return python
