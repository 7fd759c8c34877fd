"""``python -m edgebuild init``: a new project's files, never overwriting one, and a
starter manifest with one artifact of every kind that verifies at once."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.core.registry import builtin_names, fixtures, get_kind, kind_names
from edgebuild.core.manifest import load_manifest
from edgebuild.cli.scaffold import DODO, starter_manifest
from edgebuild.core.config import without_settings

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
        # The test set-up installs the example plugin; init imports no plugin unless asked.
        "plugin kinds installed, not loaded: onnx_float16, safetensors_subset (init --plugins writes their starters "
        "and parameters too)\n"
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
    # One artifact of every built-in kind (each has a starter).
    assert sorted({params.kind for params in manifest.artifacts.values()}) == builtin_names()
    # With --plugins, of every installed kind that has a starter (a plugin's may have none).
    assert init("with", "--plugins", cwd=tmp_path).returncode == 0
    manifest = load_manifest(tmp_path / "with" / "artifacts.yaml", environ={})
    assert sorted({params.kind for params in manifest.artifacts.values()}) == [
        name for name in kind_names() if get_kind(name).starter is not None]


def test_init_in_the_current_directory(tmp_path: Path) -> None:
    result = init(cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith("(init --plugins writes their starters and parameters too)\nnext:\n"
                                  "  doit list      # the artifacts the manifest declares\n"
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
     "proj/.gitignore: a symbolic link to {root}/outside; init writes inside the project and never through a link "
     "(it appends /build/, /cache/ to .gitignore): remove the link, or init another directory"),
    # Inside the project too: one rule for every link on the way to a file init writes.
    (lambda root: ((root / "proj" / "conf").mkdir(parents=True), (root / "proj" / "conf" / "ignore").write_text("x\n"),
                   (root / "proj" / ".gitignore").symlink_to("conf/ignore")),
     "proj/.gitignore: a symbolic link to conf/ignore; init writes inside the project and never through a link "
     "(it appends /build/, /cache/ to .gitignore): remove the link, or init another directory"),
    # A linked folder would take the sample images anywhere (as root: into /etc).
    (lambda root: ((root / "elsewhere").mkdir(), (root / "proj" / "data").mkdir(parents=True),
                   (root / "proj" / "data" / "calibration").symlink_to(root / "elsewhere")),
     "proj/data/calibration: a symbolic link to {root}/elsewhere; init writes inside the project and never through "
     "a link (it writes data/calibration/scene_000.png there): remove the link, or init another directory"),
    (lambda root: ((root / "proj").mkdir(), (root / "proj" / "data").symlink_to(root / "gone")),
     "proj/data: a symbolic link to {root}/gone; init writes inside the project and never through a link (it writes "
     "data/calibration/scene_000.png there): remove the link, or init another directory"),
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
    manifest = starter_manifest(plugins=True)
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
@pytest.mark.workflow
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
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' -e ./examples/safetensors-subset -e ./examples/onnx-float16 && .venv/bin/python -m edgebuild toolenv litert >/dev/null && .venv/bin/python -m pytest -n auto --dist worksteal",
    ]


# --- CI for the user's repository ---------------------------------------------------------

# Where a runner installs edgebuild and the example plugin from: the test set-up installs
# both from local directories, which a runner cannot reach.
REQUIREMENTS = ("--requirement", "edgebuild @ git+https://git.example.com/team/edgebuild@v0.1.0",
                "--requirement", "edgebuild-safetensors-subset@git+https://git.example.com/team/subset@v1")
PINNED = re.compile(r"[\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+")


def ci_project(tmp_path: Path, kind: str = "github") -> Path:
    result = init("proj", "--ci", kind, *REQUIREMENTS, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return tmp_path / "proj"


def venv_tool(name: str) -> str:
    """A linter the test extra installs beside this interpreter (never skipped: the set-up
    promises it)."""
    tool = Path(sys.executable).with_name(name)
    if not tool.is_file():
        pytest.fail(f"{tool} is missing: the test extra installs it (pip install -e '.[test]')", pytrace=False)
    return str(tool)


def test_init_ci_github_writes_the_workflow_the_docs_describe(tmp_path: Path) -> None:
    import yaml

    from edgebuild.cli.ci_template import WORKFLOW_JOBS

    result = init("proj", "--ci", "github", *REQUIREMENTS, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ci/requirements.txt, ci/edgebuild.sh, .github/workflows/edgebuild.yml" in result.stdout
    project = tmp_path / "proj"
    script = project / "ci" / "edgebuild.sh"
    assert script.stat().st_mode & 0o111
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # The installs name what was asked, with the extras the starter's kinds need (the QNN
    # and target starters are written: the test set-up has their extras) and sign.
    assert (project / "ci" / "requirements.txt").read_text().splitlines()[-2:] == [
        "edgebuild[executorch,litert,openvino,qnn,sign] @ git+https://git.example.com/team/edgebuild@v0.1.0",
        "edgebuild-safetensors-subset@git+https://git.example.com/team/subset@v1",
    ]
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
    for name, job in jobs.items():
        # Every job installs what ci/requirements.txt names, stops at a timeout, uses actions pinned by commit.
        assert isinstance(job["timeout-minutes"], int) and 0 < job["timeout-minutes"] <= 120, name
        installs = [step["run"] for step in job["steps"] if "pip install" in step.get("run", "")]
        assert installs == ["python3 -m pip install -r ci/requirements.txt && python3 -m edgebuild toolenv --needed"], name
        for step in job["steps"]:
            assert "uses" not in step or PINNED.fullmatch(step["uses"]) is None  # the comment is not part of the value
            assert "uses" not in step or re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
    # One shard count: the matrix's size, which the shard's argument is made of.
    shard = jobs["shard"]
    assert shard["strategy"]["matrix"] == {"shard": [1, 2]}
    assert shard["env"]["SHARD"] == "${{ matrix.shard }}/${{ strategy.job-total }}"
    assert [step["run"] for step in shard["steps"] if "--shard" in step.get("run", "")] == ['bash ci/edgebuild.sh --shard "$SHARD"']
    assert "SHARDS" not in str(workflow)
    # The cache key follows the installed versions, edgebuild's and the plugins' among them.
    (cache,) = [step for step in shard["steps"] if step.get("uses", "").startswith("actions/cache@")]
    versions = next(step for step in shard["steps"] if step.get("id") == "versions")
    assert versions["run"] == 'echo "digest=$(bash ci/edgebuild.sh --versions)" >> "$GITHUB_OUTPUT"'
    assert shard["steps"].index(versions) < shard["steps"].index(cache)
    assert cache["with"]["key"].startswith("edgebuild-${{ runner.os }}-${{ steps.versions.outputs.digest }}-")
    assert all("${{ steps.versions.outputs.digest }}" in key for key in cache["with"]["restore-keys"].splitlines())
    # The shards keep their lock files; the lock job merges and checks them; the gather waits for it.
    uploads = {step["with"]["name"]: step["with"]["path"] for job in jobs.values() for step in job["steps"]
               if step.get("uses", "").startswith("actions/upload-artifact@")}
    assert uploads["artifacts-lock-shard-${{ matrix.shard }}"] == uploads["artifacts-lock"] == "artifacts.lock"
    assert jobs["lock"]["needs"] == "shard" and jobs["gather"]["needs"] == ["shard", "lock"]
    # Pull requests never write the shared cache; only main signs, and gathers.
    shard_steps = "\n".join(step.get("run", "") for step in shard["steps"])
    assert 'if [ "$TRUSTED_BUILD" != true ]; then echo "EDGEBUILD_REMOTE_CACHE_READONLY=1"' in shard_steps
    assert workflow["env"]["TRUSTED_BUILD"] == "${{ github.event_name == 'push' && github.ref == 'refs/heads/main' }}"
    assert jobs["gather"]["if"] == "github.event_name == 'push' && github.ref == 'refs/heads/main'"
    # The signing key: a secret of an environment only main deploys to. A pull request's shard
    # runs in no environment, and no step it runs (its own scripts, dodo.py, plugins) can read
    # the key: only one step, on main only, names the secret, and no job's env does.
    assert "EDGEBUILD_SIGNING_KEY" not in workflow["env"]
    trusted = "(github.event_name == 'push' && github.ref == 'refs/heads/main')"
    assert shard["environment"] == f"${{{{ {trusted} && 'edgebuild-signing' || '' }}}}"
    assert jobs["gather"]["environment"] == "edgebuild-signing"
    for name, job in jobs.items():
        assert "secrets." not in json.dumps(job.get("env", {})), name
        holding = [step for step in job["steps"] if "secrets.EDGEBUILD_SIGNING_KEY" in json.dumps(step)]
        assert len(holding) == (1 if name in ("shard", "gather") else 0), name
        assert all(step["env"] == {"SIGNING_KEY_PEM": "${{ secrets.EDGEBUILD_SIGNING_KEY }}"} for step in holding)
        if name == "shard":
            assert holding[0]["if"] == "env.TRUSTED_BUILD == 'true'"
    # The shared remote cache, or a directory the shards hand over: set once, by a step of each
    # job that needs one, never also by the workflow's env (no question of which one wins).
    assert "EDGEBUILD_REMOTE_CACHE" not in workflow["env"]
    for name in ("shard", "gather"):
        runs = "\n".join(step.get("run", "") for step in jobs[name]["steps"])
        assert 'echo "EDGEBUILD_REMOTE_CACHE=$remote" >> "$GITHUB_ENV"' in runs, name


def test_the_workflow_passes_actionlint_and_zizmor(tmp_path: Path) -> None:
    """Real linters, offline: actionlint (with ShellCheck on every run: step) and zizmor's
    strictest persona find nothing in the workflow, nor ShellCheck in the script."""
    project = ci_project(tmp_path)
    workflow = project / ".github" / "workflows" / "edgebuild.yml"
    shellcheck = venv_tool("shellcheck")
    linted = subprocess.run([venv_tool("actionlint"), "-shellcheck", shellcheck, "-no-color", str(workflow)],
                            cwd=project, capture_output=True, text=True, timeout=120)
    assert (linted.returncode, linted.stdout, linted.stderr) == (0, "", "")
    # The auditor persona: every audit, secrets outside an environment among them.
    audited = subprocess.run([venv_tool("zizmor"), "--offline", "--persona=auditor", "--no-progress", str(workflow)],
                             cwd=project, capture_output=True, text=True, timeout=120)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert "No findings to report." in audited.stdout + audited.stderr
    checked = subprocess.run([shellcheck, str(project / "ci" / "edgebuild.sh")], capture_output=True, text=True)
    assert (checked.returncode, checked.stdout) == (0, "")
    # The linters do find what they look for (a run: step that splits a word, an action by tag).
    broken = workflow.read_text().replace('--shard "$SHARD"', "--shard $SHARD", 1)
    workflow.write_text(broken.replace(f"{CHECKOUT_PIN}", "actions/checkout@v7", 1))
    assert subprocess.run([venv_tool("actionlint"), "-shellcheck", shellcheck, str(workflow)], cwd=project,
                          capture_output=True, text=True).stdout.count("SC2086") == 1
    assert subprocess.run([venv_tool("zizmor"), "--offline", "--no-progress", str(workflow)], cwd=project,
                          capture_output=True, text=True).returncode != 0


CHECKOUT_PIN = "actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1"


def test_init_ci_refuses_a_package_a_runner_cannot_reach(tmp_path: Path) -> None:
    """The test set-up installs edgebuild from this checkout (editable): a runner cannot
    install from there, so init says so and writes nothing; --requirement says where."""
    import json

    # As the init process finds it (here, the checkout's own egg-info may come first on sys.path).
    installed = subprocess.run(
        [sys.executable, "-c", "from importlib import metadata; d = metadata.distribution('edgebuild'); "
         "print(d.version); print(d.read_text('direct_url.json'))"], cwd=tmp_path, capture_output=True, text=True)
    version, direct = installed.stdout.split("\n", 1)
    url = json.loads(direct)["url"]
    assert url.startswith("file://"), "the test set-up installs edgebuild from the checkout"
    result = init("proj", "--ci", "github", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"edgebuild: error: --ci: edgebuild {version} was installed from {url}, which a CI runner "
        "cannot reach; say where a runner installs it: --requirement 'edgebuild @ git+https://HOST/ORG/REPO@TAG' "
        "(a git URL, a wheel's URL, or edgebuild==VERSION from your package index)\n"
    )
    assert not (tmp_path / "proj").exists()
    bad = init("proj", "--ci", "script", "--requirement", "edgebuild", cwd=tmp_path)
    assert bad.stderr == (
        "edgebuild: error: --requirement: expected a line of a requirements file naming where a runner installs a "
        "package (NAME @ URL, or NAME==VERSION from a package index), found 'edgebuild'\n")
    alone = init("proj", "--requirement", "edgebuild==0.1.0", cwd=tmp_path)
    assert alone.stderr == "edgebuild: error: --requirement: says what CI installs; give it with --ci github or --ci script\n"
    assert not (tmp_path / "proj").exists()


@pytest.mark.parametrize("direct_url, requirement", [
    (None, "fake-dist==1.2.3"),
    ({"url": "https://git.example.com/team/fake.git", "vcs_info": {"vcs": "git", "commit_id": "ab" * 20}},
     f"fake-dist @ git+https://git.example.com/team/fake.git@{'ab' * 20}"),
    ({"url": "https://git.example.com/team/mono.git", "subdirectory": "fake",
      "vcs_info": {"vcs": "git", "commit_id": "cd" * 20, "requested_revision": "v1"}},
     f"fake-dist @ git+https://git.example.com/team/mono.git@{'cd' * 20}#subdirectory=fake"),
    ({"url": "https://files.example.com/fake_dist-1.2.3-py3-none-any.whl", "archive_info": {}},
     "fake-dist @ https://files.example.com/fake_dist-1.2.3-py3-none-any.whl"),
])
def test_a_package_is_pinned_as_it_was_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 direct_url: dict | None, requirement: str) -> None:
    """How pip recorded each install (PEP 610's direct_url.json; none from an index) is what
    a runner installs: the version, the commit, the archive."""
    import json

    from edgebuild.cli.ci_template import _as_installed

    info = tmp_path / "fake_dist-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dist\nVersion: 1.2.3\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _as_installed("fake-dist") == requirement


def test_a_path_checkpoint_missing_on_a_runner_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    project = ci_project(tmp_path, "script")
    (project / "artifacts.yaml").write_text(
        "checkpoints:\n  qwen:\n    path: /nonexistent/models/qwen\n  tiny:\n    fixture: qwen3_5_vl_tiny\n"
        "artifacts:\n  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
        "  u:\n    kind: qwen3_5_vision_tower\n    checkpoint: tiny\n    image_size: 64\n")
    result = subprocess.run(["bash", "ci/edgebuild.sh", "--check"], cwd=project, capture_output=True, text=True,
                            env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    assert (result.returncode, result.stdout) == (2, "t\tqwen3_5_vision_tower\t\nu\tqwen3_5_vision_tower\t\n")
    assert result.stderr == (
        "edgebuild: error: artifacts.yaml:3:5: checkpoints -> qwen -> path: /nonexistent/models/qwen is not on this "
        "runner, which has the repository's files and the hf: checkpoints ci/edgebuild.sh --download fetches; give the "
        "checkpoint as hf: ORG/NAME, commit it into the repository, or put it at /nonexistent/models/qwen in a "
        "workflow step before the check\n"
    )


def test_the_versions_digest_follows_every_installed_package(tmp_path: Path) -> None:
    import hashlib

    project = ci_project(tmp_path, "script")
    digest = subprocess.run(["bash", "ci/edgebuild.sh", "--versions"], cwd=project, capture_output=True, text=True,
                            env={**os.environ, "PYTHON": sys.executable}, timeout=300)
    frozen = subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, timeout=300)
    # pip names an editable install from a clone with a remote by its egg fragment, which
    # spells the name with underscores: either spelling is the package.
    assert re.search(r"^edgebuild==|#egg=edgebuild(&|$)|\(edgebuild==", frozen.stdout, re.M), frozen.stdout
    assert re.search(r"edgebuild[-_]safetensors[-_]subset", frozen.stdout), frozen.stdout
    assert (digest.returncode, digest.stdout) == (0, hashlib.sha256(frozen.stdout.encode()).hexdigest()[:16] + "\n")


@pytest.mark.slow
@pytest.mark.workflow
def test_the_ci_jobs_run_as_written_check_shards_lock_and_a_frozen_gather_that_publishes(tmp_path: Path, keys) -> None:
    """The steps of every job of the workflow, each on a fresh clone as a runner has it, on
    two tiny towers and the ORT file of one (whose bytes onnxruntime laid out anew in each
    process: the lock job failed on it): the check; two shards that sign and push (each writing the lock file
    of its part); the lock job, which merges the shards' lock files and fails while the
    committed one is not that, then passes once it is committed; and the gather (frozen,
    trusting the key), which pulls, exports and judges nothing, and publishes a signed release."""
    import json

    from helpers import TOWER_MANIFEST, commit, git

    project = ci_project(tmp_path)
    (project / "artifacts.yaml").write_text(
        TOWER_MANIFEST + "  u:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 96\n"
        "  u_ort:\n    kind: ort_format\n    source: u\n")
    commit(project, ".", message="the project, without a lock file")
    remote, published = tmp_path / "remote", tmp_path / "published"
    remote.mkdir()
    base = without_settings(os.environ)
    base |= {"PYTHON": sys.executable, "EDGEBUILD_REMOTE_CACHE": str(remote),
             "EDGEBUILD_TRUSTED_KEYS": f"{keys['team']}.pub"}
    signing = {"EDGEBUILD_SIGNING_KEY": f"{keys['team']}.key"}
    runners = iter(range(100))

    def runner() -> Path:
        """A fresh checkout of the project's last commit: no build/, cache/ or anything untracked."""
        clone = tmp_path / f"runner{next(runners)}"
        subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True, timeout=120)
        return clone

    def step(where: Path, *args: str, status: int = 0, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["bash", "ci/edgebuild.sh", *args], cwd=where, env=base | extra,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == status, done.stdout + done.stderr
        return done

    assert step(runner(), "--check").stdout == \
        "t\tqwen3_5_vision_tower\t\nu\tqwen3_5_vision_tower\t\nu_ort\tort_format\t\n"
    def shards(run: str) -> tuple[Path, dict]:
        """Both shards of the matrix, each on a runner of its own; the lock files they wrote
        as the lock job downloads them, and every entry they wrote."""
        locks, built = tmp_path / f"shard-locks-{run}", {}
        for index in (1, 2):
            shard = runner()
            done = step(shard, "--shard", f"{index}/2", **signing)
            assert "signed by key" in done.stderr or "pulled from the remote cache" in done.stderr, done.stderr
            (locks / f"artifacts-lock-shard-{index}").mkdir(parents=True)
            shutil.copy(shard / "artifacts.lock", locks / f"artifacts-lock-shard-{index}" / "artifacts.lock")
            built |= json.loads((shard / "artifacts.lock").read_text())["artifacts"]
        return locks, built

    locks, built = shards("first")
    assert sorted(built) == ["t", "u", "u_ort"]
    gate = runner()
    stale = step(gate, "--lock", str(locks), status=1)
    assert stale.stderr == ("edgebuild: error: artifacts.lock is not committed; 2 shards' lock files merged into "
                            "artifacts.lock: commit it (frozen runs pull by it)\n")
    assert json.loads((gate / "artifacts.lock").read_text())["artifacts"] == built
    shutil.copy(gate / "artifacts.lock", project / "artifacts.lock")
    commit(project, "artifacts.lock", message="the lock file the shards wrote")
    # The next run's shards pull what the first pushed, and write the committed lock again;
    # the ORT file, gone from the remote, is converted again in another process, to the same bytes.
    from edgebuild.cache.entries import entry_key

    (remote / entry_key(built["u_ort"]["fingerprint"])).unlink()
    locks, again = shards("second")
    # Costs aside, as the lock job compares (another run costs other seconds).
    assert {key: value for key, value in again["u_ort"].items() if key != "cost"} == \
        {key: value for key, value in built["u_ort"].items() if key != "cost"}
    assert step(runner(), "--lock", str(locks)).stdout == "2 shards' lock files merged into artifacts.lock: as committed\n"

    gather = step(runner(), "--gather", EDGEBUILD_FROZEN="1", EDGEBUILD_PUBLISH_TO=str(published), **signing)
    assert "built in" not in gather.stderr and "(qwen3_5_vision_tower): PASSED" not in gather.stderr
    assert "-- verify:t" in gather.stdout and "-- verify:u" in gather.stdout
    index = json.loads((published / "index.json").read_text())
    for name in ("t", "u", "u_ort"):
        assert index["artifacts"][name][index["latest"][name]]["signed"] is True
    assert git(project, "status", "--porcelain") == ""
