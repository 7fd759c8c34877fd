"""What a kind's own tests call: the contract checks every built-in kind gets, and a tiny
project to run the real doit commands in.

    from edgebuild.testing import check_kind_contract

    def test_my_kind_keeps_the_contract(tmp_path):
        check_kind_contract("my_kind", tmp_path)

:func:`check_kind_contract` loads the kind through the registry (as a manifest
would: built-in list or entry point), checks its declaration, checks that its code
digests cover its build and verify modules (and nothing of the engine), and, if it
has a starter, writes a project with that entry (and the entries of the kinds its
``source:`` takes) on their generated checkpoints and runs ``doit verify`` there.
Each check is also a function of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from edgebuild.cli.scaffold import DODO
from edgebuild.core.fingerprint import code_digests, kind_code_packages
from edgebuild.core.kind import ArtifactKind
from edgebuild.core.project import verify_roots
from edgebuild.core.registry import all_kinds, check_kind, get_kind
from edgebuild.core.config import without_settings

__all__ = ["TinyProject", "check_code_digests", "check_kind_contract", "check_registration", "check_starter_verifies"]

# Modules of edgebuild no kind's digest may hold: the engine, the caches, the commands;
# but for the judge every verify digest holds (the kind's checks, then those along the
# chain and on data).
_ENGINE_PREFIXES = ("edgebuild/run/", "edgebuild/cache/", "edgebuild/cli/")
JUDGE_MODULES = ("edgebuild/run/verification.py", "edgebuild/run/chain.py", "edgebuild/run/latency.py",
                 "edgebuild/run/coverage.py")


class TinyProject:
    """A project directory as a user's: ``dodo.py`` and a manifest; the real doit
    commands run in it (installed entry points), with no remote cache."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "dodo.py").write_text(DODO)

    def manifest(self, text: str, name: str = "artifacts.yaml") -> Path:
        path = self.root / name
        path.write_text(textwrap.dedent(text))
        return path

    def doit(self, *args: str, env: dict[str, str] | None = None, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        environment = without_settings(os.environ)
        environment["EDGEBUILD_REMOTE_CACHE"] = "off"
        environment.update(env or {})
        doit = shutil.which("doit", path=str(Path(sys.executable).parent)) or "doit"
        return subprocess.run([doit, *args], cwd=self.root, env=environment, capture_output=True, text=True, timeout=timeout)

    def workspace(self) -> Any:
        from edgebuild.run.workspace import Workspace

        return Workspace.open(self.root / "artifacts.yaml", self.root)


def check_registration(name: str) -> ArtifactKind:
    """The kind loads through the registry and declares what every kind must."""
    kind = get_kind(name)
    check_kind(type(kind), name)
    return kind


def check_code_digests(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The kind's build digest holds its build module, its verify digest its verify module
    and edgebuild's judge; neither holds the engine, the caches or the commands; every key
    is a package-relative path. Returns both digests."""
    kind = get_kind(name)
    packages = kind_code_packages(kind)
    build = code_digests(kind.build_module, packages=packages)
    verify = code_digests(*verify_roots(kind), packages=packages)
    for module, digest, what in ((kind.build_module, build, "build"), (kind.verify_module, verify, "verify")):
        path = module.replace(".", "/")
        if f"{path}.py" not in digest and f"{path}/__init__.py" not in digest:
            raise AssertionError(f"{name}: the {what} digest does not hold {module} itself: {sorted(digest)}")
    if not set(JUDGE_MODULES) <= set(verify):
        raise AssertionError(f"{name}: the verify digest does not hold edgebuild's judge ({', '.join(JUDGE_MODULES)})")
    engine = [key for key in (*build, *(key for key in verify if key not in JUDGE_MODULES))
              if key.startswith(_ENGINE_PREFIXES)]
    if engine:
        raise AssertionError(f"{name}: its digests hold engine code, which changes no artifact: {sorted(set(engine))}")
    absolute = [key for key in (*build, *verify) if os.path.isabs(key) or key.startswith("..")]
    if absolute:
        raise AssertionError(f"{name}: digest keys must be package-relative: {absolute}")
    return build, verify


def _starter_entry(kind: ArtifactKind) -> dict[str, Any]:
    import yaml

    if kind.starter is None:
        raise AssertionError(f"kind {kind.name!r} has no starter")
    return yaml.safe_load(kind.starter.entry)


def _source_kind_of(kind: ArtifactKind) -> ArtifactKind | None:
    """Of the kinds ``kind`` takes as a source, the one whose starter entry defines the
    artifact ``kind``'s starter entry names as its ``source:``."""
    (entry,) = _starter_entry(kind).values()
    wanted = entry.get("source")
    if wanted is None:
        return None
    takes = [candidate for candidate in all_kinds() if kind.takes_source_of(candidate)]
    for candidate in takes:
        if candidate.starter is not None and wanted in _starter_entry(candidate):
            return candidate
    raise AssertionError(f"kind {kind.name!r}: no starter of the kinds whose artifacts it takes "
                         f"({', '.join(candidate.name for candidate in takes) or 'none'}) defines its source {wanted!r}")


def _starter_chain(name: str) -> list[ArtifactKind]:
    """Kind ``name`` and the kinds its starter's sources are, sources first."""
    chain = [get_kind(name)]
    while (source := _source_kind_of(chain[0])) is not None:
        chain.insert(0, source)
    return chain


def starter_manifest_of(name: str) -> str:
    """A manifest with the starter entry of kind ``name`` and of the kinds its starter's
    ``source:`` chain goes through, on their generated checkpoints."""
    entries: list[str] = []
    checkpoints: dict[str, str] = {}
    for kind in _starter_chain(name):
        assert kind.starter is not None
        entries.append(kind.starter.entry)
        checkpoints.update(kind.starter.checkpoints)
    lines = ["checkpoints:"]
    for checkpoint, fixture in checkpoints.items():
        lines += [f"  {checkpoint}:", f"    fixture: {fixture}"]
    lines += ["artifacts:", *(entry.rstrip("\n") for entry in entries)]
    return "\n".join(lines) + "\n"


def check_starter_verifies(name: str, directory: Path) -> TinyProject:
    """The kind's starter entry builds and verifies with ``doit verify``, in a new project
    under ``directory`` with the starter's sample inputs."""
    project = TinyProject(directory)
    project.manifest(starter_manifest_of(name))
    for kind in _starter_chain(name):
        for relative, content in (kind.starter.samples if kind.starter else {}).items():
            path = project.root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.write_bytes(content())
    result = project.doit("verify")
    if result.returncode != 0 or "0 failed, 0 not run" not in result.stdout:
        raise AssertionError(f"{name}: the starter entry did not verify:\n{result.stdout}\n{result.stderr}")
    return project


def check_kind_contract(name: str, directory: Path) -> None:
    """Every check above: registration, code digests and, for a kind with a starter, that
    the starter builds and verifies (in ``directory``)."""
    kind = check_registration(name)
    check_code_digests(name)
    if kind.starter is not None:
        check_starter_verifies(name, directory)
