"""Acceptance: what a new user does, through the CLI only. A fresh virtual environment
with a normal (non-editable) install of this checkout; a fresh directory outside it;
``python -m edgebuild init``; ``doit verify``; ``doit -k status --check`` from a
subdirectory. Nothing of the checkout is importable there: no PYTHONPATH, no editable
finder, no per-project doit configuration -- only the installed package.

Installing takes minutes (torch and the rest), once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.config import without_settings

from helpers import REPO, assert_quiet

# Minutes of installing: apart from the suite (`pytest -m install`; CI runs it after the suite).
pytestmark = [pytest.mark.slow, pytest.mark.install]

# What pip says when it cannot reach an index (or find a pinned wheel offline).
UNREACHABLE = (
    "Could not find a version that satisfies the requirement",
    "No matching distribution found",
    "Failed to establish a new connection",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "Name or service not known",
    "ProxyError",
    "Read timed out",
)


def user_environment() -> dict[str, str]:
    """The caller's environment without anything that would reach into this checkout or
    another environment (pip's own settings stay: they say where packages come from)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {
        key: value for key, value in os.environ.items()
        if key not in dropped and key in without_settings(os.environ)
    }


def checkout_files() -> list[str]:
    """The checkout as a clone would have it: tracked files and new files that git does
    not ignore (so no build/, cache/, .venv/ or egg-info)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, text=True,
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so what to install is unclear: {listed.stderr.strip()}")
    return [name for name in listed.stdout.split("\0") if name and (REPO / name).is_file()]


@pytest.fixture(scope="session")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding a non-editable install of a copy of the checkout.

    A copy, because pip builds a source tree in place and would leave setuptools'
    build/ and egg-info in the checkout."""
    root = tmp_path_factory.mktemp("new-user-install")
    source = root / "edgebuild-source"
    for name in checkout_files():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=user_environment())
    install = subprocess.run(
        # Byte-compiling every installed module is pip's default and a minute here; the
        # interpreter compiles what it imports anyway. What is installed is the same.
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", str(source)],
        cwd=root, env=user_environment(), capture_output=True, text=True, timeout=3600,
    )
    if install.returncode != 0:
        output = install.stdout + install.stderr
        if any(sign in output for sign in UNREACHABLE):
            last = [line for line in output.splitlines() if line.strip()][-1]
            pytest.skip(f"pip could not reach the package index to install edgebuild's dependencies: {last}")
        pytest.fail(f"pip install of the checkout failed ({install.returncode}):\n{output[-4000:]}", pytrace=False)
    return venv


def run(venv: Path, program: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / program), *args], cwd=cwd, env=user_environment(), capture_output=True, text=True,
        timeout=1800,
    )


def test_a_new_user_initialises_verifies_and_checks_from_a_subdirectory(user_venv: Path, tmp_path: Path) -> None:
    project = tmp_path / "my-models"
    project.mkdir()
    assert not project.resolve().is_relative_to(REPO)

    # The package imported is the installed one, not the checkout.
    where = run(user_venv, "python", "-c", "import edgebuild; print(edgebuild.__file__)", cwd=project)
    assert Path(where.stdout.strip()).is_relative_to(user_venv), where.stdout + where.stderr

    init = run(user_venv, "python", "-m", "edgebuild", "init", cwd=project)
    assert init.returncode == 0, init.stdout + init.stderr
    assert init.stdout == (
        "wrote dodo.py, artifacts.yaml, edgebuild.schema.json, data/calibration/*.png, data/held_out/*.png, "
        ".gitignore in .\n"
        "next:\n"
        "  doit list      # the artifacts the manifest declares\n"
        "  doit verify    # build and verify every one of them\n"
    )
    assert not (project / "pyproject.toml").exists()

    listed = run(user_venv, "doit", "list", cwd=project)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [
        "clip_64", "clip_64_ort", "clip_64_program", "clip_64_qdq", "siglip_f143_gptq", "siglip_f143_gptq_onnx",
        "tower_224_fp32", "tower_224_qdq", "verify",
    ]
    # A plain install has no QNN provider (the `qnn` extra): its starter entry is commented out.
    assert "  # Needs the 'qnn' extra: pip install 'edgebuild[qnn]', then uncomment." in (project / "artifacts.yaml").read_text()

    verify = run(user_venv, "doit", "verify", cwd=project)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.splitlines()[-1] == "verify: 8 passed, 0 failed, 0 not run"
    assert "Traceback" not in verify.stderr
    assert_quiet(verify)
    # ... unless asked for (a float16 graph: a new export, whose constant folding onnx notes).
    manifest = project / "artifacts.yaml"
    manifest.write_text(
        manifest.read_text() + "  siglip_fp16:\n    kind: siglip_f143_onnx\n    source: siglip_f143_gptq\n    dtype: fp16\n"
    )
    loud = run(user_venv, "doit", "build", "-v", "2", "siglip_fp16", cwd=project)  # or EDGEBUILD_VERBOSE=1
    assert loud.returncode == 0, loud.stdout + loud.stderr
    assert "Skipping constant folding for op Split with multiple outputs." in loud.stderr
    manifest.write_text(manifest.read_text().split("  siglip_fp16:\n", 1)[0])

    subdirectory = project / "notebooks" / "drafts"
    subdirectory.mkdir(parents=True)
    status = run(user_venv, "doit", "-k", "status", "--check", cwd=subdirectory)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout == (
        "clip_64_program        up to date (verified)\n"
        "clip_64                up to date (verified)\n"
        "clip_64_qdq            up to date (verified)\n"
        "tower_224_fp32         up to date (verified)\n"
        "tower_224_qdq          up to date (verified)\n"
        "siglip_f143_gptq       up to date (verified)\n"
        "siglip_f143_gptq_onnx  up to date (verified)\n"
        "clip_64_ort            up to date (verified)\n"
    )
    assert list(subdirectory.iterdir()) == []
    assert (project / "artifacts.lock").is_file() and (project / "build" / "tower_224_fp32" / "report.json").is_file()
