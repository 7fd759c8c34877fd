"""Tools that live in an environment of their own, because they cannot share edgebuild's.

LiteRT's converter, ``litert-torch`` 0.10 (the one release for torch 2.13), pins
``litert-converter`` 0.5, which pins ``xdsl`` 0.28, which wants ``typing-extensions`` below
4.13; model-signing (signed releases) wants 4.14.1 or later. So the converter runs in a
virtual environment beside edgebuild's, with the same torch (a ``torch.export`` program
loads only in the torch that saved it): ``python -m edgebuild toolenv litert`` makes it
(``.venv-litert`` beside the environment edgebuild runs in, or where
``EDGEBUILD_LITERT_PYTHON`` says), and the ``litert`` kind runs its converter there, as a
script that imports nothing of edgebuild. Where the converter imports in edgebuild's
own environment, it runs there instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from edgebuild.core.config import Settings, variable_of


@dataclass(frozen=True)
class ToolEnvironment:
    """An environment of its own: what it installs, the module that shows it is there,
    the setting that names its Python, and its directory beside edgebuild's environment."""

    name: str
    packages: tuple[str, ...]
    module: str
    setting: str
    directory: str
    versions: tuple[str, ...]


TOOL_ENVIRONMENTS = {
    "litert": ToolEnvironment(
        name="litert",
        # torch as edgebuild pins it: the program the converter loads was saved by that torch;
        # ml_dtypes as edgebuild pins it (pyproject.toml: 0.7.0 takes 1.1 s to import).
        packages=("torch==2.13.0", "litert-torch==0.10.0", "ai-edge-litert==2.3.0", "ml_dtypes==0.6.*"),
        module="litert_torch",
        setting="litert_python",
        directory=".venv-litert",
        versions=("litert-torch", "litert-converter", "torch"),
    ),
}
_VERSIONS: dict[str, dict[str, str]] = {}


def tool_python(name: str, settings: Settings | None = None) -> Path:
    """The Python of tool environment ``name``: the setting's, else the default directory beside
    the environment edgebuild runs in (which may not exist)."""
    environment = TOOL_ENVIRONMENTS[name]
    settings = settings if settings is not None else Settings.from_environ()
    given = getattr(settings, environment.setting)
    if given:
        return Path(given)
    return Path(sys.prefix).parent / environment.directory / "bin" / "python"


def missing_reason(name: str, settings: Settings | None = None) -> str | None:
    """Why tool environment ``name`` cannot be used (``None`` when it can)."""
    environment = TOOL_ENVIRONMENTS[name]
    python = tool_python(name, settings)
    if not python.is_file():
        return (f"{environment.module} runs in an environment of its own, and there is none at {python}: "
                f"python -m edgebuild toolenv {name} makes it (or set {variable_of(environment.setting)})")
    return None


def tool_versions(name: str, settings: Settings | None = None) -> dict[str, str]:
    """The versions of the tool environment's packages (``not installed`` where there is none),
    read once a process: they are in the fingerprints of the artifacts it makes."""
    environment = TOOL_ENVIRONMENTS[name]
    if name not in _VERSIONS:
        found = dict.fromkeys(environment.versions, "not installed")
        if missing_reason(name, settings) is None:
            script = ("import importlib.metadata as m, json\n"
                      f"names = {list(environment.versions)!r}\n"
                      "found = {}\nfor n in names:\n    try:\n        found[n] = m.version(n)\n"
                      "    except m.PackageNotFoundError:\n        found[n] = 'not installed'\n"
                      "print(json.dumps(found))\n")
            result = subprocess.run([str(tool_python(name, settings)), "-c", script], capture_output=True, text=True,
                                    timeout=120)
            if result.returncode == 0:
                found = json.loads(result.stdout)
        _VERSIONS[name] = {f"{environment.name}:{package}": version for package, version in found.items()}
    return dict(_VERSIONS[name])


def make(name: str, directory: Path | None = None, log=print) -> Path:
    """Make tool environment ``name`` (a virtual environment with its packages) at ``directory``
    (default: beside edgebuild's environment); return its Python."""
    import venv

    environment = TOOL_ENVIRONMENTS[name]
    target = directory if directory is not None else Path(sys.prefix).parent / environment.directory
    python = target / "bin" / "python"
    if not python.is_file():
        log(f"making {target}")
        venv.EnvBuilder(with_pip=True).create(target)
    log(f"installing {', '.join(environment.packages)} into {target}")
    subprocess.run([str(python), "-m", "pip", "install", "-q", *environment.packages], check=True)
    return python
