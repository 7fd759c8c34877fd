"""Which code each fingerprint covers, for every registered kind: the build digest the
code that can change an artifact's bytes, the verify digest the code that judges it;
and the shape of the package: no import cycle (annotation-only imports included), no
import running upward, nothing outside kinds/ importing a kind. Each kind's exact
sets are in its own test module (``assert_code_digests`` in helpers)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.fingerprint import NEUTRAL_MODULES, _module_file, code_digests, kind_code_packages, package_roots
from edgebuild.core.project import verify_roots
from edgebuild.core.registry import get_kind, kind_names

from helpers import REPO, build_digest, made_once, verify_digest

PACKAGE_ROOT = package_roots("edgebuild")[0]
# In every build digest: the kind interface (its contexts hand a kind its checkpoints).
KIND_INTERFACE = {"edgebuild/core/checkpoint.py", "edgebuild/core/kind.py"}
# In every verify digest beside that: the judging path (the kind's checks, then those along
# the chain and on data) and the report writer.
JUDGING = {"edgebuild/core/report.py", "edgebuild/core/record.py", "edgebuild/run/verification.py",
           "edgebuild/run/chain.py", "edgebuild/run/latency.py", "edgebuild/run/coverage.py",
           "edgebuild/targets/coverage.py", "edgebuild/ml/modules.py"}
# Code that can change neither an artifact's bytes nor its verdict.
NEVER_DIGESTED = {
    "edgebuild/__init__.py", "edgebuild/errors.py", "edgebuild/plugin.py", "edgebuild/tasks.py", "edgebuild/api.py",
    "edgebuild/core/timing.py", "edgebuild/core/registry.py", "edgebuild/core/figures.py", "edgebuild/core/config.py",
    "edgebuild/core/manifest.py", "edgebuild/core/project.py", "edgebuild/kinds/__init__.py",
}
# Packages whose modules never enter a digest: the commands, the engine (but its judge),
# the caches.
NEVER_DIGESTED_PACKAGES = ("edgebuild/cli/", "edgebuild/cache/", "edgebuild/run/")
# The built-in kinds (a plugin installed beside them has its own package and tests).
from edgebuild.kinds import BUILTIN_KINDS  # noqa: E402

KINDS = sorted(BUILTIN_KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_build_digest_holds_the_build_module_and_the_kind_interface(kind: str) -> None:
    covered = set(build_digest(kind))
    module = get_kind(kind).build_module
    assert f"{module.replace('.', '/')}.py" in covered
    assert KIND_INTERFACE <= covered


@pytest.mark.parametrize("kind", KINDS)
def test_verify_digest_holds_the_verify_module_and_the_judge(kind: str) -> None:
    covered = set(verify_digest(kind))
    module = get_kind(kind).verify_module
    assert f"{module.replace('.', '/')}.py" in covered
    assert KIND_INTERFACE | JUDGING <= covered


@pytest.mark.parametrize("kind", KINDS)
def test_the_engine_commands_and_errors_are_in_no_digest(kind: str) -> None:
    covered = set(build_digest(kind)) | (set(verify_digest(kind)) - {"edgebuild/run/verification.py",
                                                                     "edgebuild/run/chain.py",
                                                                     "edgebuild/run/latency.py",
                                                                     "edgebuild/run/coverage.py"})
    assert covered.isdisjoint(NEVER_DIGESTED)
    assert not [path for path in covered if path.startswith(NEVER_DIGESTED_PACKAGES)]


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_module_of_another_kind_is_digested_only_for_its_file_names(kind: str) -> None:
    """A kind may read another's file names (``params.py``), never its build or verify code."""
    own = get_kind(kind)
    for other in KINDS:
        if other == kind:
            continue
        foreign = get_kind(other)
        for module in (foreign.build_module, foreign.verify_module):
            path = f"{module.replace('.', '/')}.py"
            assert path not in build_digest(kind) and path not in verify_digest(kind), (kind, path)
    assert kind_code_packages(own) == ("edgebuild",)


def test_imports_under_type_checking_are_not_followed() -> None:
    from edgebuild.core.fingerprint import module_imports

    # model.py imports Checkpoint for annotations only; the errors and its geometry at run time.
    assert module_imports("edgebuild.models.qwen3_5.model") == {
        "edgebuild.errors", "edgebuild.models.qwen3_5.geometry"
    }


def test_names_from_the_plugin_facade_are_followed_to_where_they_are_defined() -> None:
    from edgebuild.core.fingerprint import module_imports

    assert module_imports("edgebuild.kinds.qwen3_5_tower.verify") >= {"edgebuild.core.report", "edgebuild.core.kind"}
    assert "edgebuild.plugin" not in module_imports("edgebuild.kinds.qwen3_5_tower.verify")
    # Phases (neutral) and BuildContext: the facade's other names (figures, errors, ...) are not followed.
    assert module_imports("edgebuild.kinds.qwen3_5_tower.build") & {"edgebuild.core.figures", "edgebuild.core.fixtures"} == set()


def test_exporter_opset_range_is_the_installed_exporters() -> None:
    import onnx

    from edgebuild.ml.onnx_tools import EXPORTER_MAX_OPSET

    assert EXPORTER_MAX_OPSET == onnx.defs.onnx_opset_version()


def test_neutral_modules_exist() -> None:
    assert all(_module_file(module) is not None for module in NEUTRAL_MODULES)


# --- the shape of the package ----------------------------------------------------------------

# Lower layers never import higher ones: errors; core; cache and ml; the model half; the
# target half; plugin and kinds; run; api and cli; the facades and ``python -m`` above all.
LAYERS = [
    ("edgebuild.errors", 0), ("edgebuild.core", 1), ("edgebuild.cache", 2), ("edgebuild.ml", 2),
    ("edgebuild.models", 3), ("edgebuild.targets", 4), ("edgebuild.plugin", 5), ("edgebuild.kinds", 5),
    ("edgebuild.run", 6), ("edgebuild.api", 7), ("edgebuild.cli", 7), ("edgebuild.testing", 8),
    ("edgebuild.tasks", 8), ("edgebuild.__main__", 8),
]


def _layer(module: str) -> int:
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    assert module == "edgebuild", module
    return 9


def _package_modules() -> list[str]:
    root = PACKAGE_ROOT.parent
    modules = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def _import_graph() -> dict[str, set[str]]:
    """Every edgebuild module -> the edgebuild modules it imports: at module level, lazily
    inside functions, and under ``if TYPE_CHECKING:`` (an annotation ties meanings too)."""
    import ast

    modules = set(_package_modules())
    graph: dict[str, set[str]] = {}
    for module in modules:
        path = _module_file(module)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                targets = [f"{target}.{alias.name}" for alias in node.names] + [target]
            else:
                continue
            for target in targets:
                while target and target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != module:
                    found.add(target)
                    break
        graph[module] = found
    return graph


def test_no_import_cycle_in_the_package() -> None:
    graph = _import_graph()
    state: dict[str, int] = {}

    def cycle_from(module: str, stack: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target] if target in stack else [module, target]
            if target not in state:
                found = cycle_from(target, [*stack, target])
                if found:
                    return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            assert cycle_from(module, [module]) is None


def test_no_import_runs_upward_and_only_kinds_import_a_kind() -> None:
    upward = []
    for module, targets in _import_graph().items():
        for target in targets:
            if module != "edgebuild" and _layer(target) > _layer(module):
                upward.append(f"{module} -> {target}")
            if target.startswith("edgebuild.kinds.") and not module.startswith("edgebuild.kinds."):
                upward.append(f"{module} -> {target} (a specific kind)")
    assert upward == []


def test_no_kind_imports_another_kind() -> None:
    """A kind reads another's artifacts as a format (``produces``, ``consumes``), never its code."""
    across = [f"{module} -> {target}" for module, targets in _import_graph().items()
              if module.startswith("edgebuild.kinds.") for target in targets
              if target.startswith("edgebuild.kinds.") and target.split(".")[2] != module.split(".")[2]]
    assert across == []


def test_the_centre_names_no_kind_and_no_target() -> None:
    """What a target or a model does differently lives in its own package: outside kinds/,
    models/ and targets/, no file (code, templates) names a kind, the package a kind lives
    in, a coverage target or a tool environment. A new target touches none of them."""
    import re

    kinds = [get_kind(name) for name in KINDS]  # a plugin's own names may be ordinary words (float16)
    names = {kind.name for kind in kinds}
    names |= {path.name for path in (PACKAGE_ROOT / "kinds").iterdir() if (path / "__init__.py").is_file()}
    names |= {target for kind in kinds for target in kind.certificates()}
    names |= {environment.name for kind in kinds for environment in kind.tool_environments}
    assert {"hf_onnx", "litert", "nnapi", "directml", "qnn_htp"} <= names  # the scan looks for what is there
    word = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(sorted(map(re.escape, names))) + r")(?![A-Za-z0-9_])",
                      re.IGNORECASE)
    named = []
    for path in sorted(PACKAGE_ROOT.rglob("*")):
        relative = path.relative_to(PACKAGE_ROOT)
        if (not path.is_file() or relative.parts[0] in ("kinds", "models", "targets") or "__pycache__" in relative.parts
                or path.suffix in (".pyc", ".nbi", ".nbc")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            named += [f"edgebuild/{relative}:{number}: {found.group(0)}" for found in word.finditer(line)]
    assert named == []


def test_at_most_fourteen_modules_at_the_top_of_the_package() -> None:
    # A dozen, and the two halves kinds are declared on (models/, targets/).
    top = [path.name for path in PACKAGE_ROOT.iterdir()
           if path.name != "__init__.py" and (path.suffix == ".py" or (path / "__init__.py").is_file())]
    assert len(top) <= 14, sorted(top)


# --- editing code in a copy of the package ------------------------------------------------

# One process edits the copy file by file, recomputing every kind's two digests after
# each edit (the digests read the files afresh: no module of the copy is re-imported).
_EDITS_SCRIPT = """
import json, sys
from pathlib import Path
from edgebuild.core import fingerprint
from edgebuild.core.hashing import digest_json
from edgebuild.core.project import verify_roots
from edgebuild.core.registry import get_kind

kinds = [get_kind(name) for name in json.loads(sys.argv[1])]
def digests():
    fingerprint._CODE_CACHE.clear()
    packages = fingerprint.kind_code_packages
    return {kind.name: [digest_json(fingerprint.code_digests(kind.build_module, packages=packages(kind))),
                        digest_json(fingerprint.code_digests(*verify_roots(kind), packages=packages(kind)))]
            for kind in kinds}
before = digests()
changed = {}
for edited in json.loads(sys.argv[2]):
    path = Path("edgebuild") / edited
    original = path.read_text()
    try:
        path.write_text(original + "\\n\\ndef _an_unused_function() -> None:\\n    pass\\n")
        after = digests()
    finally:
        path.write_text(original)
    changed[edited] = [sorted(name for name in before if before[name][0] != after[name][0]),
                       sorted(name for name in before if before[name][1] != after[name][1])]
print(json.dumps(changed))
"""


def _importers(module_path: str, which: str) -> set[str]:
    """The kinds whose ``which`` digest holds ``module_path``."""
    digest = build_digest if which == "build" else verify_digest
    return {kind for kind in KINDS if module_path in digest(kind)}


ALL = set(KINDS)
# The kinds that write an ONNX graph: their verifications compute its certificates.
ONNX_GRAPHS = {"hf_onnx", "onnx_qdq", "qwen3_5_tower_qdq", "qwen3_5_vision_tower", "siglip_f143_onnx"}
GENERIC_EDITS = [
    ("core/report.py", set(), ALL),
    ("run/verification.py", set(), ALL),
    ("run/latency.py", set(), ALL),
    ("run/coverage.py", set(), ALL),
    ("targets/coverage.py", set(), ALL),
    # A target's certificate re-verifies the artifacts whose formats carry it, and no other.
    ("targets/onnx_graph.py", set(), ONNX_GRAPHS),
    ("targets/directml_kernels.py", set(), ONNX_GRAPHS),
    ("kinds/executorch/coverage.py", set(), {"executorch"}),
    ("kinds/openvino/coverage.py", set(), {"openvino"}),
    # What targets share rebuilds the targets that use it; a target's own code, only that target.
    ("targets/folding.py", {"executorch", "litert"}, set()),
    ("kinds/litert/convert.py", {"litert"}, set()),
    ("targets/judging.py", set(), {"executorch", "litert", "openvino"}),
    # The node -> module mapping: the QNN context names the nodes its compile refused with it.
    ("ml/modules.py", {"qnn_context"}, ALL),
    ("core/kind.py", ALL, ALL),
    ("errors.py", set(), set()),
    ("__init__.py", set(), set()),
    ("plugin.py", set(), set()),
    ("kinds/__init__.py", set(), set()),
    ("core/registry.py", set(), set()),
    ("core/figures.py", set(), set()),
    ("cli/build.py", set(), set()),
    ("run/scheduler.py", set(), set()),
]
# Each kind's own build and verify modules: exactly the kinds that digest them change.
KIND_EDITS = [
    (f"{getattr(get_kind(kind), which + '_module').removeprefix('edgebuild.').replace('.', '/')}.py", which)
    for kind in KINDS for which in ("build", "verify")
]


@pytest.fixture(scope="module")
def changed_by_edit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[set[str], set[str]]]:
    """Each edited file of a copy of the package -> the kinds whose build and verify
    digests an unused function added to it changes."""
    def make(root: Path) -> None:
        shutil.copytree(PACKAGE_ROOT, root / "edgebuild", ignore=shutil.ignore_patterns("__pycache__", "*.nbi", "*.nbc"))
        edits = sorted({edited for edited, *_ in GENERIC_EDITS} | {edited for edited, _ in KIND_EDITS})
        result = subprocess.run([sys.executable, "-c", _EDITS_SCRIPT, json.dumps(KINDS), json.dumps(edits)], cwd=root,
                                capture_output=True, text=True, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                                timeout=300)
        assert result.returncode == 0, result.stderr
        (root / "changed.json").write_text(result.stdout)

    changed = json.loads((made_once(tmp_path_factory, "code-digest-edits", make) / "changed.json").read_text())
    return {edited: (set(build), set(verify)) for edited, (build, verify) in changed.items()}


@pytest.mark.slow
@pytest.mark.parametrize(("edited", "build_changes", "verify_changes"), GENERIC_EDITS)
def test_editing_shared_code_changes_exactly_the_digests_it_should(
    changed_by_edit: dict[str, tuple[set[str], set[str]]], edited: str, build_changes: set[str], verify_changes: set[str]
) -> None:
    assert changed_by_edit[edited] == (build_changes, verify_changes)


@pytest.mark.slow
@pytest.mark.parametrize(("edited", "which"), KIND_EDITS)
def test_editing_a_kinds_module_changes_the_digests_that_hold_it(
    changed_by_edit: dict[str, tuple[set[str], set[str]]], edited: str, which: str
) -> None:
    expected = (_importers(f"edgebuild/{edited}", "build"), _importers(f"edgebuild/{edited}", "verify"))
    assert expected[0 if which == "build" else 1], edited
    assert changed_by_edit[edited] == expected


def test_digests_are_keyed_by_package_relative_paths() -> None:
    """Two checkouts at different paths agree: no key names where the package lives."""
    for kind in KINDS:
        for path in (*build_digest(kind), *verify_digest(kind)):
            assert path.startswith("edgebuild/") and not Path(path).is_absolute()
    assert (REPO / "edgebuild").resolve() == PACKAGE_ROOT
    assert code_digests(*verify_roots(get_kind(KINDS[0]))) == verify_digest(KINDS[0])
