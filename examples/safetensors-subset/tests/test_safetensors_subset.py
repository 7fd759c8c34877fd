"""The example plugin keeps edgebuild's kind contract (``edgebuild.testing``): it loads
through its entry point, its digests cover its own code, its starter builds and verifies."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild.testing import check_code_digests, check_kind_contract


def test_the_plugins_digests_cover_its_own_package() -> None:
    build, verify = check_code_digests("safetensors_subset")
    assert "edgebuild_safetensors_subset/build.py" in build
    assert "edgebuild_safetensors_subset/__init__.py" in build  # the parameters it reads
    assert "edgebuild_safetensors_subset/verify.py" in verify and "edgebuild_safetensors_subset/verify.py" not in build


@pytest.mark.slow
def test_the_plugin_keeps_the_contract(tmp_path: Path) -> None:
    check_kind_contract("safetensors_subset", tmp_path)


@pytest.mark.slow
def test_an_edit_of_a_module_its_build_imports_makes_it_stale(tmp_path: Path) -> None:
    """A copy of the package ahead on the path stands in for an edit of the installed one."""
    import shutil

    import edgebuild_safetensors_subset
    from edgebuild.testing import TinyProject, starter_manifest_of

    project = TinyProject(tmp_path / "project")
    project.manifest(starter_manifest_of("safetensors_subset"))
    assert project.doit("build").returncode == 0
    assert project.doit("status").stdout == "tower_weights  up to date (not verified)\n"
    copy = tmp_path / "copy"
    shutil.copytree(Path(edgebuild_safetensors_subset.__file__).parent, copy / "edgebuild_safetensors_subset",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = copy / "edgebuild_safetensors_subset" / "__init__.py"
    init.write_text(init.read_text() + "\n\ndef _an_unused_function() -> None:\n    pass\n")
    stale = project.doit("status", env={"PYTHONPATH": str(copy)})
    assert stale.stdout == "tower_weights  stale\n                 - edgebuild_safetensors_subset/__init__.py changed\n"
