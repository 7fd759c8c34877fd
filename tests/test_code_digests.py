"""Which code each fingerprint covers: the build digest exactly the code that can change
an artifact's bytes, the verify digest the code that judges it, and no import cycle."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.fingerprint import NEUTRAL_MODULES, _PACKAGE_ROOT, code_digests, module_imports
from edgebuild.kinds import get_kind, kind_names
from edgebuild.core.project import VERIFICATION_MODULE

# The kind interface (its contexts hand a kind its checkpoints): in every digest.
KIND_INTERFACE = ["edgebuild/core/checkpoint.py", "edgebuild/core/kind.py"]
BUILD_CODE = {
    "qnn_context": [
        "edgebuild/core/kind.py",
        "edgebuild/kinds/qnn_context/build.py",
        "edgebuild/kinds/qnn_context/compile.py",
        "edgebuild/kinds/qnn_context/params.py",
        "edgebuild/kinds/qnn_context/qnn.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/params.py",
    ],
    "qwen3_5_vision_tower": [
        "edgebuild/kinds/qwen3_5_tower/build.py",
        "edgebuild/kinds/qwen3_5_tower/model.py",
        "edgebuild/kinds/qwen3_5_tower/params.py",
        "edgebuild/ml/onnx_tools.py",
    ],
    "qwen3_5_tower_qdq": [
        "edgebuild/ml/images.py",
        "edgebuild/core/inputs.py",
        "edgebuild/core/kind.py",
        "edgebuild/kinds/qwen3_5_tower/params.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/build.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/graph.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/inputs.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/params.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/qdq.py",
        "edgebuild/ml/onnx_tools.py",
    ],
    "siglip_f143": [
        "edgebuild/ml/compare.py",
        "edgebuild/core/hashing.py",
        "edgebuild/ml/images.py",
        "edgebuild/core/inputs.py",
        "edgebuild/kinds/siglip_f143/build.py",
        "edgebuild/kinds/siglip_f143/calibration.py",
        "edgebuild/kinds/siglip_f143/packed.py",
        "edgebuild/kinds/siglip_f143/params.py",
        "edgebuild/ml/quant/f143.py",
        "edgebuild/ml/quant/gptq.py",
        "edgebuild/ml/quant/kernels.py",
        "edgebuild/ml/siglip.py",
    ],
    "siglip_f143_onnx": [
        "edgebuild/core/hashing.py",
        "edgebuild/ml/images.py",
        "edgebuild/core/inputs.py",
        "edgebuild/kinds/siglip_f143/params.py",
        "edgebuild/kinds/siglip_f143_onnx/build.py",
        "edgebuild/kinds/siglip_f143_onnx/model.py",
        "edgebuild/kinds/siglip_f143_onnx/params.py",
        "edgebuild/ml/onnx_tools.py",
        "edgebuild/ml/quant/f143.py",
        "edgebuild/ml/quant/kernels.py",
        # The source's config.json in any SigLIP layout (already in the source's fingerprint).
        "edgebuild/ml/siglip.py",
    ],
}
# Every verify digest holds the builder's verify path and the report writer.
JUDGING = ["edgebuild/core/atomic.py", "edgebuild/core/hashing.py", "edgebuild/core/record.py", "edgebuild/core/report.py", "edgebuild/run/verification.py"]
VERIFY_CODE = {
    "qnn_context": [
        "edgebuild/ml/compare.py",
        "edgebuild/core/kind.py",
        "edgebuild/kinds/qnn_context/params.py",
        "edgebuild/kinds/qnn_context/qnn.py",
        "edgebuild/kinds/qnn_context/verify.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/params.py",
        "edgebuild/ml/onnx_tools.py",
    ],
    "qwen3_5_vision_tower": [
        "edgebuild/ml/compare.py",
        "edgebuild/kinds/qwen3_5_tower/model.py",
        "edgebuild/kinds/qwen3_5_tower/params.py",
        "edgebuild/kinds/qwen3_5_tower/verify.py",
        "edgebuild/ml/onnx_tools.py",
    ],
    "qwen3_5_tower_qdq": [
        "edgebuild/ml/compare.py",
        "edgebuild/ml/images.py",
        "edgebuild/core/inputs.py",
        "edgebuild/core/kind.py",
        "edgebuild/kinds/qwen3_5_tower/params.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/graph.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/inputs.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/params.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/qdq.py",
        "edgebuild/kinds/qwen3_5_tower_qdq/verify.py",
        "edgebuild/ml/onnx_tools.py",
    ],
    "siglip_f143": [
        "edgebuild/ml/compare.py",
        "edgebuild/ml/images.py",
        "edgebuild/core/inputs.py",
        "edgebuild/kinds/siglip_f143/packed.py",
        "edgebuild/kinds/siglip_f143/params.py",
        "edgebuild/kinds/siglip_f143/verify.py",
        "edgebuild/ml/quant/f143.py",
        "edgebuild/ml/quant/kernels.py",
        "edgebuild/ml/siglip.py",
    ],
    "siglip_f143_onnx": [
        "edgebuild/ml/images.py",
        "edgebuild/core/inputs.py",
        "edgebuild/kinds/siglip_f143/params.py",
        "edgebuild/kinds/siglip_f143_onnx/model.py",
        "edgebuild/kinds/siglip_f143_onnx/params.py",
        "edgebuild/kinds/siglip_f143_onnx/verify.py",
        "edgebuild/ml/onnx_tools.py",
        "edgebuild/ml/siglip.py",
    ],
}
ALL_KINDS = {"qnn_context", "qwen3_5_tower_qdq", "qwen3_5_vision_tower", "siglip_f143", "siglip_f143_onnx"}
# Code that can change neither an artifact's bytes nor its verdict.
NEVER_DIGESTED = ["edgebuild/__init__.py", "edgebuild/errors.py", "edgebuild/core/timing.py", "edgebuild/cli/commands.py",
                  "edgebuild/cli/tasks.py", "edgebuild/run/state.py", "edgebuild/kinds/__init__.py", "edgebuild/core/registry.py"]


def test_every_kind_is_listed_here() -> None:
    assert sorted(BUILD_CODE) == sorted(VERIFY_CODE) == kind_names()


@pytest.mark.parametrize("kind", sorted(BUILD_CODE))
def test_build_digest_covers_exactly_the_build_path(kind: str) -> None:
    assert sorted(code_digests(get_kind(kind).build_module)) == sorted(set(KIND_INTERFACE + BUILD_CODE[kind]))


@pytest.mark.parametrize("kind", sorted(VERIFY_CODE))
def test_verify_digest_covers_exactly_the_judging_path(kind: str) -> None:
    covered = code_digests(get_kind(kind).verify_module, VERIFICATION_MODULE)
    assert sorted(covered) == sorted(set(KIND_INTERFACE + VERIFY_CODE[kind] + JUDGING))


@pytest.mark.parametrize("kind", sorted(BUILD_CODE))
def test_the_cli_errors_and_timing_are_in_no_digest(kind: str) -> None:
    covered = set(code_digests(get_kind(kind).build_module)) | set(
        code_digests(get_kind(kind).verify_module, VERIFICATION_MODULE)
    )
    assert covered.isdisjoint(NEVER_DIGESTED)


def test_imports_under_type_checking_are_not_followed() -> None:
    # model.py imports Checkpoint for annotations only; params.py and errors.py at run time.
    assert module_imports("edgebuild.kinds.qwen3_5_tower.model") == {
        "edgebuild.errors", "edgebuild.kinds.qwen3_5_tower.params"
    }


def test_exporter_opset_range_is_the_installed_exporters() -> None:
    import onnx

    from edgebuild.ml.onnx_tools import EXPORTER_MAX_OPSET

    assert EXPORTER_MAX_OPSET == onnx.defs.onnx_opset_version()


def _package_modules() -> list[str]:
    root = _PACKAGE_ROOT.parent
    modules = []
    for path in sorted(_PACKAGE_ROOT.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_no_import_cycle_in_the_package() -> None:
    """Module-level and lazy imports alike (a cycle through a lazy import still ties two
    modules' meanings together). Type-only imports are not edges."""
    graph = {module: sorted(module_imports(module)) for module in _package_modules()}
    state: dict[str, int] = {}

    def cycle_from(module: str, stack: list[str]) -> list[str] | None:
        state[module] = 1
        for target in graph.get(module, []):
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target] if target in stack else [module, target]
            if target not in state:
                found = cycle_from(target, [*stack, target])
                if found:
                    return found
        state[module] = 2
        return None

    for module in graph:
        if module not in state:
            assert cycle_from(module, [module]) is None


# --- editing code in a copy of the package ------------------------------------------------

_DIGESTS_SCRIPT = """
import json
from edgebuild.core.fingerprint import code_digests
from edgebuild.core.hashing import digest_json
from edgebuild.kinds import get_kind, kind_names
from edgebuild.core.project import VERIFICATION_MODULE
print(json.dumps({kind: [digest_json(code_digests(get_kind(kind).build_module)),
                         digest_json(code_digests(get_kind(kind).verify_module, VERIFICATION_MODULE))]
                  for kind in kind_names()}))
"""


def _digests_of_copy(root: Path) -> dict[str, list[str]]:
    result = subprocess.run([sys.executable, "-c", _DIGESTS_SCRIPT], cwd=root, capture_output=True, text=True,
                            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("copy")
    shutil.copytree(_PACKAGE_ROOT, root / "edgebuild", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
    return root


@pytest.mark.parametrize(
    ("edited", "build_changes", "verify_changes"),
    [
        ("core/report.py", set(), ALL_KINDS),
        ("errors.py", set(), set()),
        ("__init__.py", set(), set()),
        ("cli/commands.py", set(), set()),
        ("run/verification.py", set(), ALL_KINDS),
        ("kinds/qwen3_5_tower/verify.py", set(), {"qwen3_5_vision_tower"}),
        ("kinds/siglip_f143/verify.py", set(), {"siglip_f143"}),
        ("ml/quant/f143.py", {"siglip_f143", "siglip_f143_onnx"}, {"siglip_f143"}),
        ("ml/quant/gptq.py", {"siglip_f143"}, set()),
        ("kinds/qwen3_5_tower/build.py", {"qwen3_5_vision_tower"}, set()),
        # The QDQ kind reads the tower's file names, never its build code.
        ("kinds/qwen3_5_tower/params.py", {"qwen3_5_vision_tower", "qwen3_5_tower_qdq"}, {"qwen3_5_vision_tower", "qwen3_5_tower_qdq"}),
        ("kinds/qwen3_5_tower_qdq/qdq.py", {"qwen3_5_tower_qdq"}, {"qwen3_5_tower_qdq"}),
        ("kinds/qwen3_5_tower_qdq/verify.py", set(), {"qwen3_5_tower_qdq"}),
        ("kinds/qnn_context/qnn.py", {"qnn_context"}, {"qnn_context"}),
        ("kinds/qnn_context/verify.py", set(), {"qnn_context"}),
    ],
)
def test_editing_code_changes_exactly_the_digests_it_should(
    package_copy: Path, edited: str, build_changes: set[str], verify_changes: set[str]
) -> None:
    before = _digests_of_copy(package_copy)
    path = package_copy / "edgebuild" / edited
    original = path.read_text()
    try:
        path.write_text(original + "\n\ndef _an_unused_function() -> None:\n    pass\n")
        after = _digests_of_copy(package_copy)
    finally:
        path.write_text(original)
    assert {kind for kind in before if before[kind][0] != after[kind][0]} == build_changes
    assert {kind for kind in before if before[kind][1] != after[kind][1]} == verify_changes


def test_neutral_modules_exist() -> None:
    from edgebuild.core.fingerprint import _module_file

    assert all(_module_file(module) is not None for module in NEUTRAL_MODULES)
