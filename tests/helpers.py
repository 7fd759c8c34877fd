"""Helpers the tests share (fixtures live in ``conftest.py``): project directories
laid out as a user's, the one-tower manifest, copies of a built project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The generated tiny checkpoint each kind's tests build from: a kind without one is untested.
KIND_FIXTURES = {
    "qnn_context": "qwen3_5_vl_tiny",
    "qwen3_5_vision_tower": "qwen3_5_vl_tiny",
    "qwen3_5_tower_qdq": "qwen3_5_vl_tiny",
    "siglip_f143": "siglip_tiny",
    "siglip_f143_onnx": "siglip_tiny",
}


class ProjectDir:
    """A project directory laid out as a user's: dodo.py and a manifest (the commands
    come from the installed package's entry points)."""

    def __init__(self, root: Path, lay_out: bool = True) -> None:
        self.root = root
        if not lay_out:
            return
        shutil.copy(REPO / "dodo.py", root / "dodo.py")

    @classmethod
    def existing(cls, root: Path) -> "ProjectDir":
        """A project directory that is already laid out (a copy of another)."""
        return cls(root, lay_out=False)

    def manifest(self, text: str, name: str = "artifacts.yaml") -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(text))
        return path

    def doit(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        require_installed_commands()
        environment = {
            key: value for key, value in os.environ.items() if key not in ("EDGEBUILD_MANIFEST", "EDGEBUILD_VERBOSE")
        }
        environment.update(env or {})
        doit = Path(sys.executable).with_name("doit")
        return subprocess.run(
            [str(doit), *args], cwd=cwd or self.root, env=environment, capture_output=True, text=True, timeout=600
        )

    def project(self):
        from edgebuild.core.project import Project

        return Project.load(self.root / "artifacts.yaml", self.root)


EDGEBUILD_COMMANDS = ("build", "cache", "clean", "gc", "publish", "report", "status", "verify")


def require_installed_commands() -> None:
    """The doit commands are entry points of the installed package: an install made
    before they were (or of another package) does not have them, and every CLI test
    would fail with doit's "Invalid parameter" instead of saying why."""
    import pytest
    from importlib.metadata import entry_points

    found = {point.name: point.value for point in entry_points(group="doit.COMMAND")}
    missing = [name for name in EDGEBUILD_COMMANDS if not found.get(name, "").startswith("edgebuild.cli.commands:")]
    if missing:
        pytest.fail(
            f"doit command(s) {', '.join(missing)} are not installed as entry points (group doit.COMMAND): "
            "reinstall the package (pip install -e '.[test]') so that its entry points are registered",
            pytrace=False,
        )


TOWER_MANIFEST = """\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
  t:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
"""


def clone_project(seed: Path, target: Path) -> ProjectDir:
    """A copy of ``seed`` (build/, cache/ with its store and doit state, the lock file):
    another checkout that has built and verified what the seed has."""
    shutil.copytree(seed, target, symlinks=True)
    return ProjectDir.existing(target)


def lay_out_siglip_inputs(root: Path, checkpoint: Path) -> Path:
    """A copy of the SigLIP fixture at ``root/ckpt`` and the shipped images at
    ``root/images`` (calibration) and ``root/held_out``."""
    shutil.copytree(checkpoint, root / "ckpt")
    shutil.copytree(REPO / "data" / "calibration", root / "images")
    shutil.copytree(REPO / "data" / "held_out", root / "held_out")
    return root
