"""Tools that live in an environment of their own, because they cannot share edgebuild's.

A kind declares such an environment (``tool_environments``: an
:class:`~edgebuild.core.kind.ToolEnvironment`): a virtual environment beside edgebuild's
(``.venv-<name>``), or the Python ``EDGEBUILD_<NAME>_PYTHON`` names, that holds the
tool; ``python -m edgebuild toolenv NAME`` makes it. The kind runs its tool there as a
script that imports nothing of edgebuild, or in edgebuild's own environment where the
tool imports there too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgebuild.core.config import Settings
from edgebuild.core.kind import ToolEnvironment

_VERSIONS: dict[str, dict[str, str]] = {}


def tool_python(environment: ToolEnvironment, settings: Settings | None = None) -> Path:
    """The Python of ``environment``: the one its variable names, else the default directory
    beside the environment edgebuild runs in (which may not exist)."""
    settings = settings if settings is not None else Settings.from_environ()
    given = settings.tool_python(environment.name)
    if given:
        return Path(given)
    return Path(sys.prefix).parent / environment.directory / "bin" / "python"


def missing_reason(environment: ToolEnvironment, settings: Settings | None = None) -> str | None:
    """Why ``environment`` cannot be used (``None`` when it can)."""
    python = tool_python(environment, settings)
    if not python.is_file():
        return (f"{environment.module} runs in an environment of its own, and there is none at {python}: "
                f"python -m edgebuild toolenv {environment.name} makes it (or set {environment.variable})")
    return None


def tool_versions(environment: ToolEnvironment, settings: Settings | None = None) -> dict[str, str]:
    """The versions of the environment's packages (``not installed`` where there is none),
    read once a process: they are in the fingerprints of the artifacts it makes."""
    name = environment.name
    if name not in _VERSIONS:
        found = dict.fromkeys(environment.versions, "not installed")
        if missing_reason(environment, settings) is None:
            script = ("import importlib.metadata as m, json\n"
                      f"names = {list(environment.versions)!r}\n"
                      "found = {}\nfor n in names:\n    try:\n        found[n] = m.version(n)\n"
                      "    except m.PackageNotFoundError:\n        found[n] = 'not installed'\n"
                      "print(json.dumps(found))\n")
            result = subprocess.run([str(tool_python(environment, settings)), "-c", script], capture_output=True,
                                    text=True, timeout=120)
            if result.returncode == 0:
                found = json.loads(result.stdout)
        _VERSIONS[name] = {f"{name}:{package}": version for package, version in found.items()}
    return dict(_VERSIONS[name])


def make(environment: ToolEnvironment, directory: Path | None = None, log=print) -> Path:
    """Make ``environment`` (a virtual environment with its packages) at ``directory``
    (default: beside edgebuild's environment); return its Python."""
    import venv

    target = directory if directory is not None else Path(sys.prefix).parent / environment.directory
    python = target / "bin" / "python"
    if not python.is_file():
        log(f"making {target}")
        venv.EnvBuilder(with_pip=True).create(target)
    log(f"installing {', '.join(environment.packages)} into {target}")
    subprocess.run([str(python), "-m", "pip", "install", "-q", *environment.packages], check=True)
    return python
