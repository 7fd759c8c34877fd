"""Tool environments that are not what they should be (issue 60): LiteRT's converter
Python that hangs, is no executable file, or is a directory; ``toolenv`` given a file for
its directory; a target's runtime that is installed but does not import. Each ends in one
line naming the setting or file and what was expected, in bounded time, writing nothing.
Real processes throughout: the commands as a user runs them, a shell script as the hung
Python, a package on ``PYTHONPATH`` that raises on import as the broken install."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebuild.core.config import TOOL_PROBE_SECONDS, without_settings

from helpers import lay_out_project, pretend_built

# One program, and each target that lowers it.
TARGETS = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  program:
    kind: torch_export
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
  clip_et: {kind: executorch, source: program}
  clip_tflite: {kind: litert, source: program}
  clip_ov: {kind: openvino, source: program}
"""
# Where each target's artifact is in TARGETS (its `kind:` key's position).
KIND_KEYS = {"clip_et": "artifacts.yaml:10:13", "clip_tflite": "artifacts.yaml:11:17",
             "clip_ov": "artifacts.yaml:12:13"}
# Longer than any command here takes; on a hang, the test fails at this instead of waiting.
COMMAND_SECONDS = 60


def _lay_out(root: Path) -> Path:
    """TARGETS at ``root``, its program recorded as built (files that are no program: the
    targets' fingerprints are read from their bytes, and nothing here loads them), so that
    status and build get to each target's own checks at once."""
    from edgebuild.core.hashing import digest_bytes
    from edgebuild.run.workspace import Workspace

    lay_out_project(root, TARGETS)
    outputs = {"program.pt2": b"not a program", "export.json": b"{}"}
    (root / "build" / "program").mkdir(parents=True)
    for name, data in outputs.items():
        (root / "build" / "program" / name).write_bytes(data)
    workspace = Workspace.open(root / "artifacts.yaml", root)
    pretend_built(workspace, "program", {name: digest_bytes(data) for name, data in outputs.items()})
    return root


def _run(root: Path, *command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``doit ...`` or ``python -m edgebuild ...`` in ``root``, as a user runs it."""
    environment = without_settings(os.environ) | {"EDGEBUILD_REMOTE_CACHE": "off"} | (env or {})
    program, *arguments = command
    executable = [str(Path(sys.executable).with_name("doit"))] if program == "doit" else [sys.executable, "-m", program]
    return subprocess.run([*executable, *arguments], cwd=root, env=environment, capture_output=True, text=True,
                          timeout=COMMAND_SECONDS)


def _status_of(result: subprocess.CompletedProcess[str], name: str) -> tuple[str, list[str]]:
    """``doit status``'s state of ``name`` and the lines under it."""
    lines = result.stdout.splitlines()
    (row,) = [index for index, line in enumerate(lines) if line.split()[:1] == [name]]
    below = []
    for line in lines[row + 1:]:
        if not line.startswith(" "):
            break
        below.append(line.strip().removeprefix("- "))
    return lines[row].split(None, 1)[1].strip(), below


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _converter_not_here() -> None:
    if importlib.util.find_spec("litert_torch") is not None:
        pytest.fail("litert-torch imports in edgebuild's environment; the test set-up keeps it in its own")


# --- EDGEBUILD_LITERT_PYTHON ---------------------------------------------------------------


def test_a_converter_python_that_hangs_is_stopped_and_status_says_so(tmp_path: Path) -> None:
    """`doit status` waited 120 s on the hung Python's answer, then ended in a traceback
    (TimeoutExpired); the Python and what it started are stopped after TOOL_PROBE_SECONDS now."""
    _converter_not_here()
    project = _lay_out(tmp_path / "project")
    pid_file = tmp_path / "hung.pid"
    hung = tmp_path / "python"
    hung.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    hung.chmod(0o755)
    started = time.monotonic()
    try:
        status = _run(project, "doit", "status", env={"EDGEBUILD_LITERT_PYTHON": str(hung)})
        took = time.monotonic() - started
        stopped = not _alive(int(pid_file.read_text()))
    finally:
        if pid_file.exists() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert "Traceback" not in status.stdout + status.stderr, status.stdout + status.stderr
    assert status.returncode == 1
    assert _status_of(status, "clip_tflite") == ("error", [
        f"{KIND_KEYS['clip_tflite']}: artifacts -> clip_tflite -> kind: the litert kind converts with litert_torch "
        f"runs in an environment of its own, and its Python {hung} (EDGEBUILD_LITERT_PYTHON) did not say its "
        f"packages' versions within {TOOL_PROBE_SECONDS:g} s, and was stopped; expected a Python that answers at once: "
        "python -m edgebuild toolenv litert makes it (or set EDGEBUILD_LITERT_PYTHON)"])
    # The other targets are read as before.
    assert _status_of(status, "clip_ov")[0] == "missing"
    assert stopped, "the hung Python outlived the command"
    assert TOOL_PROBE_SECONDS <= took < TOOL_PROBE_SECONDS + 30


@pytest.mark.parametrize("given", ["not executable", "a directory", "nothing"])
def test_a_converter_python_that_is_no_executable_file_is_one_line(given: str, tmp_path: Path) -> None:
    _converter_not_here()
    lay_out_project(tmp_path, TARGETS)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    if given == "not executable":
        python.write_text("#!/bin/sh\n")
    elif given == "a directory":
        python.mkdir()
    before = sorted(path.name for path in tmp_path.iterdir())
    status = _run(tmp_path, "doit", "status", env={"EDGEBUILD_LITERT_PYTHON": str(python)})
    problem = {
        "not executable": f"its Python {python} (EDGEBUILD_LITERT_PYTHON) is not executable; expected an "
                          "executable file",
        "a directory": f"its Python {python} (EDGEBUILD_LITERT_PYTHON) is a directory; expected an executable file "
                       "(such as DIR/bin/python)",
        "nothing": f"there is none at {python}",
    }[given]
    assert status.returncode == 1 and "Traceback" not in status.stdout + status.stderr
    assert _status_of(status, "clip_tflite") == ("error", [
        f"{KIND_KEYS['clip_tflite']}: artifacts -> clip_tflite -> kind: the litert kind converts with litert_torch "
        f"runs in an environment of its own, and {problem}: python -m edgebuild toolenv litert makes it (or set "
        "EDGEBUILD_LITERT_PYTHON)"])
    assert sorted(path.name for path in tmp_path.iterdir()) == before


def test_toolenv_given_a_file_for_its_directory_is_one_line(tmp_path: Path) -> None:
    """venv's ValueError ("Unable to create directory") reached the user as a traceback."""
    taken = tmp_path / "notes.txt"
    taken.write_text("mine\n")
    made = _run(tmp_path, "edgebuild", "toolenv", "litert", str(taken))
    assert made.returncode == 2
    assert made.stderr.splitlines() == [
        f"edgebuild: error: toolenv litert: {taken} is not a directory; expected the directory to make the environment "
        "in (or a path where there is nothing yet)"]
    assert taken.read_text() == "mine\n" and sorted(tmp_path.iterdir()) == [taken]


# --- a runtime installed but broken ---------------------------------------------------------


@pytest.mark.parametrize("module, kind, artifact", [("openvino", "openvino", "clip_ov"),
                                                    ("executorch", "executorch", "clip_et"),
                                                    ("ai_edge_litert", "litert", "clip_tflite")])
def test_a_runtime_that_does_not_import_is_one_line(module: str, kind: str, artifact: str, tmp_path: Path) -> None:
    """A package of the runtime's name that raises on import (a native library gone; here one
    on PYTHONPATH, ahead of the real one): the build's worker ended in its traceback, and
    status and `check --deep` said nothing was wrong. Each now says so in the same one line."""
    project = _lay_out(tmp_path / "project")
    shadow = tmp_path / "shadow" / module / "__init__.py"
    shadow.parent.mkdir(parents=True)
    shadow.write_text('raise ImportError("libruntime.so.7: cannot open shared object file: No such file")\n')
    broken = {"PYTHONPATH": str(tmp_path / "shadow")}
    line = (f"{KIND_KEYS[artifact]}: artifacts -> {artifact} -> kind: the {kind} kind needs {module}, which is "
            f"installed ({shadow}) but cannot be imported: ImportError: libruntime.so.7: cannot open shared object "
            "file: No such file")
    built_before = sorted(path.name for path in (project / "build").iterdir())

    # `check --deep` says it as status does (the same check of the kind's parameters), after 8 s of loading the model.
    status = _run(project, "doit", "status", env=broken)
    assert status.returncode == 1 and _status_of(status, artifact) == ("error", [line])
    built = _run(project, "doit", "build", artifact, env=broken)
    assert built.returncode != 0 and line in (built.stdout + built.stderr).splitlines()
    for result in (status, built):
        assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert sorted(path.name for path in (project / "build").iterdir()) == built_before
