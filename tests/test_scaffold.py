"""``python -m edgebuild init``: a new project's files, never overwriting one, and a
starter manifest with one artifact of every kind that verifies at once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.registry import fixtures, get_kind, kind_names
from edgebuild.core.manifest import load_manifest
from edgebuild.cli.scaffold import DODO, starter_manifest

from helpers import REPO, ProjectDir, assert_quiet

SAMPLES = [f"data/calibration/scene_00{seed}.png" for seed in range(4)] + [
    "data/held_out/scene_100.png", "data/held_out/scene_101.png"
]


def init(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgebuild", "init", *args], cwd=cwd, capture_output=True, text=True)


def test_init_writes_a_project(tmp_path: Path) -> None:
    result = init("proj", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "wrote dodo.py, artifacts.yaml, edgebuild.schema.json, data/calibration/*.png, data/held_out/*.png, "
        ".gitignore in proj\n"
        "next:\n"
        "  cd proj && doit list      # the artifacts the manifest declares\n"
        "  doit verify               # build and verify every one of them\n"
    )
    root = tmp_path / "proj"
    assert sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()) == sorted(
        [".gitignore", "artifacts.yaml", "dodo.py", "edgebuild.schema.json", *SAMPLES]
    )
    assert (root / "dodo.py").read_text() == DODO
    assert (root / ".gitignore").read_text() == "# edgebuild's outputs and caches (rebuilt from the manifest)\n/build/\n/cache/\n"
    # The same images as the repository's data/, byte for byte.
    for sample in SAMPLES:
        assert (root / sample).read_bytes() == (REPO / sample).read_bytes(), sample
    manifest = load_manifest(root / "artifacts.yaml", environ={})
    # One artifact of every installed kind that has a starter (a plugin's may have none).
    assert sorted({params.kind for params in manifest.artifacts.values()}) == [
        name for name in kind_names() if get_kind(name).starter is not None]


def test_init_in_the_current_directory(tmp_path: Path) -> None:
    result = init(cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("in .\nnext:\n  doit list      # the artifacts the manifest declares\n"
                                  "  doit verify    # build and verify every one of them\n")
    assert (tmp_path / "artifacts.yaml").is_file()


def test_init_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text("mine\n")
    (tmp_path / "data" / "held_out").mkdir(parents=True)
    (tmp_path / "data" / "held_out" / "scene_100.png").write_bytes(b"mine")
    (tmp_path / ".gitignore").write_text("node_modules\n/build/")
    result = init(str(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:4] == [
        f"wrote dodo.py, edgebuild.schema.json, data/calibration/*.png, data/held_out/*.png in {tmp_path}",
        f"added /cache/ to {tmp_path}/.gitignore",
        "kept artifacts.yaml: it exists (init would have written a starter manifest, one artifact of each kind)",
        "kept data/held_out/*.png: it exists (init would have written generated sample inputs)",
    ]
    assert (tmp_path / "artifacts.yaml").read_text() == "mine\n"
    assert (tmp_path / "data" / "held_out" / "scene_100.png").read_bytes() == b"mine"
    assert (tmp_path / "data" / "held_out" / "scene_101.png").read_bytes() == (REPO / "data/held_out/scene_101.png").read_bytes()
    assert (tmp_path / ".gitignore").read_text() == "node_modules\n/build/\n/cache/\n"
    again = init(str(tmp_path), cwd=tmp_path)
    assert "wrote" not in again.stdout and "added" not in again.stdout
    assert (tmp_path / ".gitignore").read_text() == "node_modules\n/build/\n/cache/\n"


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every path under ``root`` (not following links) and what it holds."""
    import os

    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if path.is_symlink():
            found[relative] = f"-> {os.readlink(path)}"
        elif path.is_file():
            found[relative] = path.read_bytes()
        else:
            found[relative] = "dir" if path.is_dir() else "other"
    return found


@pytest.mark.parametrize("arrange, message", [
    (lambda root: (root / "proj" / "data").mkdir(parents=True) or (root / "proj" / "data" / "calibration").write_text("x"),
     "proj/data/calibration: a file; expected a directory to hold data/calibration/scene_000.png"),
    (lambda root: (root / "proj").write_text("x"),
     "proj: a file; expected a directory to lay the project out in (or nothing)"),
    (lambda root: (root / "proj").symlink_to(root / "nowhere"),
     "proj: a symlink to nothing; expected a directory to lay the project out in (or nothing)"),
    (lambda root: (root / "proj").mkdir() or (root / "proj" / ".gitignore").write_bytes(b"build/\n\xff\xfe\n"),
     "proj/.gitignore: not UTF-8 text (byte 7); expected a text .gitignore (init appends /build/, /cache/ to it)"),
    (lambda root: ((root / "proj").mkdir(), (root / "outside").write_text("# theirs\n"),
                   (root / "proj" / ".gitignore").symlink_to(root / "outside")),
     "proj/.gitignore: a symlink to {root}/outside, outside the project; expected the project's own .gitignore "
     "(init appends /build/, /cache/ to it)"),
    (lambda root: (root / "proj" / "artifacts.yaml").mkdir(parents=True),
     "proj/artifacts.yaml: a directory; expected a file to keep, or nothing (init writes artifacts.yaml)"),
    (lambda root: (root / "proj").mkdir() or (root / "proj" / "dodo.py").symlink_to(root / "gone.py"),
     "proj/dodo.py: a symlink to nothing; expected a file to keep, or nothing (init writes dodo.py)"),
])
def test_init_checks_everything_first_and_writes_nothing_on_failure(tmp_path: Path, arrange, message: str) -> None:
    arrange(tmp_path)
    before = snapshot(tmp_path)
    result = init("proj", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    expected = message.format(root=tmp_path)
    assert result.stderr == f"edgebuild: error: {expected}\n"
    assert snapshot(tmp_path) == before


def test_a_write_that_fails_midway_leaves_nothing_of_the_run(tmp_path: Path) -> None:
    """A full disk, as a file-size limit stands in for it: the schema (the third file)
    cannot be written; what this run wrote before it is removed again."""
    import resource
    import signal

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "notes.txt").write_text("mine\n")
    before = snapshot(tmp_path)
    result = subprocess.run([sys.executable, "-m", "edgebuild", "init", "proj"], cwd=tmp_path, capture_output=True,
                            text=True, preexec_fn=small_files)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith("edgebuild: error: proj/edgebuild.schema.json: cannot write the project's files: File too large")
    assert result.stderr.endswith("; nothing was kept of this run\n")
    assert snapshot(tmp_path) == before


def test_every_kind_has_a_starter_on_its_fixture() -> None:
    manifest = starter_manifest()
    assert manifest.startswith("# yaml-language-server: $schema=./edgebuild.schema.json\n")
    from edgebuild.kinds import BUILTIN_KINDS

    # Every built-in kind has one (a plugin's is optional).
    assert all(get_kind(name).starter is not None for name in BUILTIN_KINDS)
    for name in kind_names():
        starter = get_kind(name).starter
        if starter is None:
            continue
        assert starter.entry in manifest
        # On generated checkpoints some kind declares (a plugin may use a built-in kind's).
        assert set(starter.checkpoints.values()) <= set(fixtures())


def test_the_repository_dodo_is_the_starter_dodo() -> None:
    assert (REPO / "dodo.py").read_text() == DODO


@pytest.mark.slow
def test_init_then_verify_the_qnn_starter(tmp_path: Path) -> None:
    """With the qnn extra installed (the test set-up has it), init writes the QNN starter
    uncommented and it builds and verifies, quietly. Every other starter is verified by a
    normal install in ``test_new_user.py``."""
    assert init("proj", cwd=tmp_path).returncode == 0
    project = ProjectDir.existing(tmp_path / "proj")
    names = list(load_manifest(project.root / "artifacts.yaml", environ={}).artifacts)
    assert "tower_224_qnn_x" in names, names
    result = project.doit("verify", "tower_224_qnn_x")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "verify: 1 passed, 0 failed, 0 not run"
    assert_quiet(result)


def test_readme_walks_a_new_user_through() -> None:
    """The README's "In your own repository" gives the install, init and verify steps
    that test_new_user.py runs; its quickstart stays two commands."""
    import re

    readme = (REPO / "README.md").read_text()
    section = readme.split("## In your own repository\n", 1)[1].split("\n## ", 1)[0]
    (commands,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    # Getting started gives the same three steps.
    getting_started = (REPO / "docs" / "getting-started.md").read_text()
    assert f"```sh\n{commands}```" in getting_started
    steps = [line.split("#")[0].strip() for line in commands.splitlines()]
    assert steps == [
        "python3 -m venv .venv && .venv/bin/pip install /path/to/edgebuild",
        ".venv/bin/python -m edgebuild init",
        ".venv/bin/doit verify",
    ]
    quickstart = readme.split("## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", quickstart, flags=re.S)
    assert [line for line in block.splitlines() if not line.startswith("#")] == [
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/doit verify",
        # The test set-up installs the example plugin too: its tests run with the suite.
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' -e ./examples/safetensors-subset && .venv/bin/python -m pytest -n auto --dist worksteal",
    ]


# --- CI for the user's repository ---------------------------------------------------------


def test_init_ci_github_writes_the_workflow_the_readme_describes(tmp_path: Path) -> None:
    import re

    import yaml

    from edgebuild.cli.ci_template import WORKFLOW_JOBS

    result = init("proj", "--ci", "github", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ci/edgebuild.sh, .github/workflows/edgebuild.yml" in result.stdout
    project = tmp_path / "proj"
    script = project / "ci" / "edgebuild.sh"
    assert script.stat().st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    workflow = yaml.safe_load((project / ".github" / "workflows" / "edgebuild.yml").read_text())
    jobs = workflow["jobs"]
    # The documentation's table lists the jobs, in order, and what each runs of the script.
    section = (REPO / "docs" / "how-to" / "ci-for-your-repository.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \| .* \|$", section, flags=re.M)
    assert tuple(jobs) == WORKFLOW_JOBS == tuple(name for name, _ in rows)
    for name, runs in rows:
        options = set(re.findall(r"--[a-z]+", runs))
        called = {option for step in jobs[name]["steps"] for option in re.findall(r"ci/edgebuild\.sh (--[a-z]+)", step.get("run", ""))}
        assert called == options, (name, called, options)
    # Every option the workflow passes is one the script handles.
    handled = set(re.findall(r"^    (--[a-z]+)\)", script.read_text(), flags=re.M))
    assert {option for _, runs in rows for option in re.findall(r"--[a-z]+", runs)} <= handled
    # Pull requests never write the shared cache; only main signs, and gathers.
    shard_steps = "\n".join(step.get("run", "") for step in jobs["shard"]["steps"])
    assert 'if [ "$TRUSTED_BUILD" != true ]; then echo "EDGEBUILD_REMOTE_CACHE_READONLY=1"' in shard_steps
    assert workflow["env"]["TRUSTED_BUILD"] == "${{ github.event_name == 'push' && github.ref == 'refs/heads/main' }}"
    assert jobs["gather"]["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    assert jobs["shard"]["env"]["SIGNING_KEY_PEM"] == "${{ secrets.EDGEBUILD_SIGNING_KEY }}"
    assert "EDGEBUILD_SIGNING_KEY" not in workflow["env"]


@pytest.mark.slow
def test_the_ci_script_runs_a_check_a_shard_and_a_frozen_gather_that_publishes(tmp_path: Path, keys) -> None:
    """The script `init --ci script` writes, run as the CI jobs run it, on the tiny tower:
    the shard signs and pushes, the gather (frozen, trusting the key) pulls, exports and
    judges nothing, and publishes a signed release."""
    import json
    import os

    from helpers import TOWER_MANIFEST, commit

    assert init("proj", "--ci", "script", cwd=tmp_path).returncode == 0
    project = tmp_path / "proj"
    assert not (project / ".github").exists()
    (project / "artifacts.yaml").write_text(TOWER_MANIFEST)
    remote, published = tmp_path / "remote", tmp_path / "published"
    remote.mkdir()
    base = {key: value for key, value in os.environ.items() if not key.startswith("EDGEBUILD_")}
    base |= {"PYTHON": sys.executable, "EDGEBUILD_REMOTE_CACHE": str(remote),
             "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub"}

    def step(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "ci/edgebuild.sh", *args], cwd=project, env=base | extra,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    step("--check")
    signing = {"EDGEBUILD_SIGNING_KEY": f"{keys['team']}.key"}
    shard = step("--shard", "1/1", **signing)
    assert "[t] built in" in shard.stderr and "signed by key" in shard.stderr
    commit(project, "artifacts.yaml", "artifacts.lock", "dodo.py", ".gitignore", "ci/edgebuild.sh",
           "edgebuild.schema.json", "data", message="the shard's lock")
    for name in ("build", "cache"):
        shutil.rmtree(project / name)
    gather = step("--gather", EDGEBUILD_FROZEN="1", EDGEBUILD_PUBLISH_TO=str(published), **signing)
    assert "built in" not in gather.stderr and "# t (qwen3_5_vision_tower)" not in gather.stderr
    assert "-- verify:t" in gather.stdout
    index = json.loads((published / "index.json").read_text())
    fingerprint = index["latest"]["t"]
    assert index["artifacts"]["t"][fingerprint]["signed"] is True
