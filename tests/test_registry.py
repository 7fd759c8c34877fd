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


def _params_of(name: str) -> type:
    from typing import Literal

    from edgebuild.plugin import ArtifactParams

    return type(f"{name}_params", (ArtifactParams,), {"__annotations__": {"kind": Literal[name]}})


def test_a_kind_written_for_the_last_release_still_loads_with_a_deprecation_warning() -> None:
    """``worker_imports`` and the other process attributes, and ``source_kinds``, are read for
    one release (with a warning naming what to write instead): a plugin keeps working while
    its author moves to ``process = Process(...)`` and ``consumes``."""
    from edgebuild.plugin import ArtifactKind

    with pytest.warns(DeprecationWarning) as caught:
        class OldStyle(ArtifactKind):
            name = "old_style"
            summary = "x"
            Params = _params_of("old_style")
            outputs = ("out.bin",)
            build_module = verify_module = "edgebuild.core.kind"
            worker_imports = ("json",)
            memory_factor = 3.0
            source_kinds = ("qwen3_5_vision_tower",)

    messages = [str(warning.message) for warning in caught]
    assert messages == [
        "artifact kind test_a_kind_written_for_the_last_release_still_loads_with_a_deprecation_warning.<locals>."
        "OldStyle: worker_imports, memory_factor are deprecated and read for one release only; declare "
        "process = Process(worker_imports=..., memory_factor=...)",
        "artifact kind test_a_kind_written_for_the_last_release_still_loads_with_a_deprecation_warning.<locals>."
        "OldStyle: source_kinds is deprecated and read for one release only; declare the formats it consumes "
        "(consumes = (...))",
    ]
    registry.register(OldStyle)
    try:
        kind = registry.get_kind("old_style")
        assert kind.process.worker_imports == ("json",) and kind.process.memory_factor == 3.0
        assert kind.takes_source_of(registry.get_kind("qwen3_5_vision_tower"))
        assert not kind.takes_source_of(registry.get_kind("hf_onnx"))
    finally:
        registry.unregister("old_style")


def test_a_certificate_is_checked_when_its_kind_is_registered() -> None:
    """A coverage target a kind certifies by default must be one a format it produces
    declares, with a certify function in a module that exists: an error at registration,
    never a certificate quietly missing from every report."""
    from edgebuild.plugin import ONNX_GRAPH, ArtifactKind, CoverageTarget, Format

    def kind_with(name: str, produces: tuple, coverage_targets: tuple = ()) -> type:
        return type(name, (ArtifactKind,), {
            "name": name, "summary": "x", "Params": _params_of(name), "outputs": ("model.onnx",),
            "build_module": "edgebuild.core.kind", "verify_module": "edgebuild.core.kind",
            "produces": produces, "coverage_targets": coverage_targets})

    unknown = kind_with("unknown_target", (ONNX_GRAPH,), ("hexagon",))
    with pytest.raises(TypeError) as caught:
        registry.register(unknown)
    assert str(caught.value) == (
        "artifact kind 'unknown_target': coverage_targets names 'hexagon', which no format it produces certifies "
        "(its targets: nnapi, coreml, directml: declare the certificate on a format in produces)")

    nowhere = Format("nowhere_graph", "x", ("model.onnx",),
                     certificates=(CoverageTarget("npu", "an NPU", "edgebuild_no_such_module:certify"),))
    with pytest.raises(TypeError, match=r"artifact kind 'missing_certify': coverage target 'npu': certify "
                                        r"'edgebuild_no_such_module:certify' is not 'module:function' of a module "
                                        r"that exists"):
        registry.register(kind_with("missing_certify", (nowhere,), ("npu",)))

    misnamed = Format("misnamed_graph", "x", ("model.onnx",),
                      certificates=(CoverageTarget("NPU-1", "an NPU", "edgebuild.targets.coverage:certify"),))
    with pytest.raises(TypeError, match=r"coverage target named 'NPU-1'; expected lower case"):
        registry.register(kind_with("misnamed_target", (misnamed,)))
    assert not {"unknown_target", "missing_certify", "misnamed_target"} & set(registry.kind_names())
