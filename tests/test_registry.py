"""The kind registry: built-in kinds listed as data and loaded by name, each checked
when it loads; a new kind is one package and one line, nothing else edited."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core import registry

from helpers import REPO, ProjectDir, vision_config_kind

KIND_PACKAGE = vision_config_kind("edgebuild.kinds.vision_config", "vision_config")
MANIFEST = "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\nartifacts:\n  vc:\n    kind: vision_config\n    checkpoint: qwen\n"


def _copy_with_a_new_kind(root: Path) -> Path:
    """A copy of the package with one new kind package and one registration line."""
    package = root / "edgebuild"
    shutil.copytree(REPO / "edgebuild", package, ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    (package / "kinds" / "vision_config").mkdir()
    for name, text in KIND_PACKAGE.items():
        (package / "kinds" / "vision_config" / name).write_text(text.lstrip())
    listing = package / "kinds" / "__init__.py"
    text = listing.read_text()
    assert text.count("BUILTIN_KINDS = {\n") == 1
    listing.write_text(text.replace("BUILTIN_KINDS = {\n", 'BUILTIN_KINDS = {\n    "vision_config": "edgebuild.kinds.vision_config:VisionConfig",\n'))
    return root


@pytest.mark.slow
def test_a_new_kind_is_one_package_and_one_line(tmp_path: Path) -> None:
    copy = _copy_with_a_new_kind(tmp_path / "copy")
    env = {"PYTHONPATH": str(copy), "EDGEBUILD_REMOTE_CACHE": "off"}
    (tmp_path / "project").mkdir()
    project = ProjectDir(tmp_path / "project")
    project.manifest(MANIFEST)

    listed = project.doit("list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("vc       [vision_config] a checkpoint's vision_config as JSON\n")
    verified = project.doit("verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: 1 passed, 0 failed, 0 not run" in verified.stdout
    status = project.doit("status", env=env)
    assert status.stdout == "vc  up to date (verified)\n"

    # From the project's directory: `python -m` puts the cwd first on the path.
    schema = subprocess.run([sys.executable, "-m", "edgebuild", "schema"], env={**env, "PATH": "/usr/bin:/bin"},
                            cwd=project.root, capture_output=True, text=True, timeout=120)
    assert schema.returncode == 0, schema.stderr
    assert "vision_config" in json.loads(schema.stdout)["$defs"]["Artifact"]["properties"]["kind"]["enum"]

    # Its build code is in its fingerprint: an edit makes it stale, and only it.
    build = copy / "edgebuild" / "kinds" / "vision_config" / "build.py"
    build.write_text(build.read_text() + "\n\ndef _an_unused_function():\n    pass\n")
    stale = project.doit("status", env=env)
    assert stale.stdout == "vc  stale\n      - edgebuild/kinds/vision_config/build.py changed\n"


def test_an_unknown_kind_names_the_installed_kinds(tmp_path: Path) -> None:
    from edgebuild.core.manifest import load_manifest
    from edgebuild.errors import ManifestError

    (tmp_path / "artifacts.yaml").write_text("artifacts:\n  a:\n    kind: qwen3_5_vision_towr\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    kinds = ", ".join(repr(name) for name in registry.kind_names())
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:3:5: artifacts -> a -> kind: unknown artifact kind 'qwen3_5_vision_towr'; "
        f"expected one of {kinds} (did you mean 'qwen3_5_vision_tower'?)"
    )


def test_a_kind_is_checked_when_it_is_registered() -> None:
    from typing import Literal

    from edgebuild.plugin import ArtifactKind, ArtifactParams

    class NoOutputsParams(ArtifactParams):
        kind: Literal["no_outputs"]

    class NoOutputs(ArtifactKind):
        name = "no_outputs"
        summary = "x"
        Params = NoOutputsParams
        outputs = ()
        build_module = verify_module = "edgebuild.core.kind"

    with pytest.raises(TypeError, match="artifact kind 'no_outputs': outputs must be a non-empty tuple of file names"):
        registry.register(NoOutputs)

    class Missing(ArtifactKind):
        name = "missing"
        summary = "x"

    with pytest.raises(TypeError, match=r"artifact kind \S*Missing does not declare 'Params'"):
        registry.register(Missing)
    assert "missing" not in registry.kind_names() and "no_outputs" not in registry.kind_names()


def test_a_fixture_of_a_built_in_name_with_another_generator_is_refused_when_a_kind_declares_it() -> None:
    """Fixtures are found in the kinds a manifest names first, without importing the others;
    a kind from elsewhere that declares a built-in fixture's name with its own generator is
    still refused (it would otherwise write other bytes under the same name). In a fresh
    process, where that kind is the only one loaded."""
    script = """
from pathlib import Path
from typing import Literal

from edgebuild.core import registry
from edgebuild.core.fixtures import fixture
from edgebuild.errors import PluginError
from edgebuild.plugin import ArtifactKind, ArtifactParams, Fixture


def own_writer(directory: Path, config: dict, seed: int) -> None:
    (directory / "config.json").write_text("{}")


class ShadowParams(ArtifactParams):
    kind: Literal["fixture_shadow"]


class Shadow(ArtifactKind):
    name = "fixture_shadow"
    summary = "declares a built-in fixture's name with a generator of its own"
    Params = ShadowParams
    outputs = ("x.json",)
    build_module = verify_module = "edgebuild.core.kind"
    fixtures = (Fixture("qwen3_5_vl_tiny", "not the tower's", {}, own_writer),)


registry.register(Shadow)
try:
    fixture("qwen3_5_vl_tiny")
except PluginError as error:
    print(error)
else:
    print("served the plugin's generator")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("fixture 'qwen3_5_vl_tiny' is declared by two kinds with different generators"), result.stdout
