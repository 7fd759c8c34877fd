"""Shared test fixtures: tiny checkpoints of the real architectures, generated once
per session, and throwaway project directories that run the real doit CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def qwen_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgebuild.fixtures import write_fixture

    return write_fixture(tmp_path_factory.mktemp("qwen") / "ckpt", "qwen3_5_vl_tiny")


class ProjectDir:
    """A project directory laid out as a user's: dodo.py, the doit config, a manifest."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.copy(REPO / "dodo.py", root / "dodo.py")
        # The doit section of the repository's pyproject.toml: the build/verify plugins.
        text = (REPO / "pyproject.toml").read_text()
        section = text[text.index("[tool.doit]"):text.index("[tool.pytest")]
        (root / "pyproject.toml").write_text(section)

    def manifest(self, text: str, name: str = "artifacts.yaml") -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(text))
        return path

    def doit(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environment = {key: value for key, value in os.environ.items() if key != "EDGEBUILD_MANIFEST"}
        environment.update(env or {})
        doit = Path(sys.executable).with_name("doit")
        return subprocess.run(
            [str(doit), *args], cwd=self.root, env=environment, capture_output=True, text=True, timeout=600
        )

    def project(self):
        from edgebuild.project import Project

        return Project.load(self.root / "artifacts.yaml", self.root)


@pytest.fixture
def project_dir(tmp_path: Path) -> ProjectDir:
    return ProjectDir(tmp_path)
