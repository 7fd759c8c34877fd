"""The project: where it keeps its caches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_project_caches_compiled_kernels_under_its_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgebuild.run.workspace import Workspace

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    (tmp_path / "artifacts.yaml").write_text("artifacts: {}\n")
    project = Workspace.load(tmp_path / "artifacts.yaml", tmp_path)
    assert os.environ["NUMBA_CACHE_DIR"] == str(project.layout.cache_dir / "numba")
