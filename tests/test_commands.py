"""The doit commands as a user meets them: entry points of the installed package,
found from any subdirectory with ``-k``; ``verify`` going on after a failure with
one summary line; ``status`` exit codes; ``cache`` and ``gc`` listing what is kept;
outputs and the lock file beside the manifest; the lock recording only what happened."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from doit.cmd_base import Command
from edgebuild.run.scheduler import Outcomes, verification_summary

from helpers import EDGEBUILD_COMMANDS, REPO, TOWER_MANIFEST, clone_project, require_installed_commands

ODD = "  odd:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 450\n"
STRICT = (
    "  strict:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
    "    verify:\n      providers: [DmlExecutionProvider]\n"
)


# --- entry points --------------------------------------------------------------------


def test_commands_are_entry_points_of_the_package() -> None:
    """Installing edgebuild is all a project needs: no doit section in any pyproject."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["doit.COMMAND"]
    # One module per command (DVC's layout): edgebuild/cli/<command>.py; doit's own
    # commands, wrapped only for their option errors, share one.
    own = {name: location for name, location in declared.items() if not location.startswith("edgebuild.cli.doit_commands:")}
    assert own == {name: f"edgebuild.cli.{name}:{name.capitalize()}" for name in EDGEBUILD_COMMANDS}
    from doit.doit_cmd import DoitMain

    assert set(declared) - set(own) == {command.get_name() for command in DoitMain.DOIT_CMDS} - {"help", "clean"}
    assert "doit" not in pyproject.get("tool", {})
    import importlib

    for name, location in declared.items():
        module, _, attribute = location.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert issubclass(command, Command) and command.get_name() == name
    require_installed_commands()


def test_verification_summary() -> None:
    outcomes = Outcomes()
    outcomes.succeeded |= {"a", "verify:a", "b"}
    outcomes.failure("verify:b", "check failed")
    outcomes.failure("c", "export failed")
    # Not run: a task it depends on failed.
    outcomes.failure("verify:c", None)
    outcomes.failure("d", None)
    outcomes.failure("verify:d", None)
    result = outcomes.verification(["a", "b", "c", "d", "e"])
    assert result == {"passed": ["a"], "failed": ["b", "c"], "not run": ["d", "e"]}
    assert verification_summary(result) == "verify: 1 passed, 2 failed (b, c), 2 not run (d, e)"
    assert verification_summary({"passed": ["a"], "failed": [], "not run": []}) == "verify: 1 passed, 0 failed, 0 not run"


def test_options_may_follow_artifact_names() -> None:
    from doit.cmdparse import CmdOption

    from edgebuild.cli.common import options_first
    from edgebuild.cli.publish import Publish

    options = [CmdOption(dict(option)) for option in Publish.cmd_options]
    assert options_first(
        ["t", "--to", "dest", "--allow-dirty", "u", "-n2", "-v", "2", "--reporter=json", "--", "--to"], options
    ) == ["--to=dest", "--allow-dirty", "-n", "2", "-v", "2", "--reporter=json", "t", "u", "--", "--to"]
    assert options_first(["t", "--unknown"], options) == ["t", "--unknown"]
    # Read by getopt's own rules wherever they stand: a unique prefix is the option.
    assert options_first(["t", "--allow-d", "u"], options) == ["--allow-dirty", "t", "u"]


_SHARD_HELP = "I/N: only shard I of N of the selection (an artifact with its sources; balanced by recorded cost)"


@pytest.mark.parametrize("args, line", [
    # An option another edgebuild command has.
    (("build", "--frozen"), "doit build has no option --frozen (it is an option of doit publish and doit verify); "
                            "`doit help build` lists its options"),
    (("status", "--to", "x"), "doit status has no option --to (it is an option of doit publish); "
                              "`doit help status` lists its options"),
    # A typo, before or after the artifact names (a unique prefix, --fail-fa, is getopt's
    # abbreviation of --fail-fast, before the names or after them alike).
    (("verify", "t", "--fail-fsat"), "doit verify has no option --fail-fsat (did you mean --fail-fast?); "
                                     "`doit help verify` lists its options"),
    (("verify", "--frozne", "t"), "doit verify has no option --frozne (did you mean --frozen?); "
                                  "`doit help verify` lists its options"),
    (("clean", "--bogus"), "doit clean has no option --bogus; `doit help clean` lists its options"),
    (("gc", "--json"), "doit gc has no option --json (it is an option of doit cache and doit diff and doit divergence and doit status); "
                       "`doit help gc` lists its options"),
    # A value missing, or given to a switch.
    (("build", "--shard"), f"--shard needs a value: {_SHARD_HELP}"),
    (("verify", "t", "--shard"), f"--shard needs a value: {_SHARD_HELP}"),
    (("publish", "--to"), "--to needs a value: where to publish: a directory or an fsspec URL"),
    (("diff", "--against"), "--against needs a value: a git revision whose committed lock file to compare with "
                            "(default HEAD), or a published destination"),
    (("gc", "--max-age"), "--max-age needs a value: remove entries unused for longer than this (e.g. 12h, 30d)"),
    (("verify", "--fail-fast=yes"), "--fail-fast takes no value, found '--fail-fast=yes'"),
    (("cache", "--json=1"), "--json takes no value, found '--json=1'"),
    # doit's own options, of the wrong type or not among their choices.
    (("build", "-n", "two"), "-n/--process: expected an integer, found 'two'"),
    (("verify", "t", "--reporter", "loud"), "-r/--reporter: expected one of console, executed-only, json, zero, "
                                            "error-only, found 'loud'"),
    # doit's own options, of the right type but a value doit misuses (it ran -P bogus as 'process').
    (("build", "-P", "bogus"), "-P/--parallel-type: expected process or thread, found 'bogus'"),
    (("verify", "t", "-n", "-3"), "-n/--process: expected a number of processes from 0 to 1024, found '-3'"),
    (("publish", "-v", "9"), "-v/--verbosity: expected 0, 1 or 2, found '9'"),
    (("build", "--failure-verbosity=5"), "--failure-verbosity: expected 0, 1 or 2, found '5'"),
    # Before the command's name, where doit takes them for its own `run`'s (and the name for a task).
    (("-P", "bogus", "build"), "-P/--parallel-type: expected process or thread, found 'bogus'"),
    (("-n", "-1", "verify", "t"), "-n/--process: expected a number of processes from 0 to 1024, found '-1'"),
    (("-P", "thread", "-n", "2", "build", "t"),
     "doit's options go after the command's name: doit build -P thread -n 2, not doit -P thread -n 2 build"),
    (("-n", "notanumber", "build"), "-n/--process: expected an integer, found 'notanumber'"),
    # doit's own commands: the same line, not doit's list of option objects.
    (("list", "-P", "bogus"), "doit list has no option -P; `doit help list` lists its options"),
    (("list", "--bogus"), "doit list has no option --bogus; `doit help list` lists its options"),
    (("run", "-n", "x"), "-n/--process: expected an integer, found 'x'"),
    (("forget", "-x"), "doit forget has no option -x; `doit help forget` lists its options"),
    (("reset-dep", "--x"), "doit reset-dep has no option --x; `doit help reset-dep` lists its options"),
    (("dumpdb", "--db-file"), "--db-file needs a value: file used to save successful runs"),
])
def test_a_misused_option_is_one_line(project_dir, args: tuple[str, ...], line: str) -> None:
    """Whatever the command and wherever the option: one line saying what is wrong and
    what was expected, before the manifest is read (doit's own message listed every
    option object it knows)."""
    project_dir.manifest("{not yaml")
    result = project_dir.doit(*args)
    assert (result.returncode, result.stdout, result.stderr) == (3, "", f"ERROR: {line}\n")


@pytest.mark.parametrize("args, line", [
    (("nosuch",), "unknown command, artifact or task 'nosuch'; `doit help` lists the commands, `doit list` the artifacts"),
    # doit's own `info` looked the name up unchecked: a KeyError traceback.
    (("info", "nosuch"), "unknown artifact or task 'nosuch'; `doit list` shows them"),
    (("info",), "`info` failed, must select *one* task. Check `doit help info`."),
])
def test_a_name_doit_does_not_know_is_one_line(project_dir, args: tuple[str, ...], line: str) -> None:
    project_dir.manifest(TOWER_MANIFEST)
    result = project_dir.doit(*args)
    assert (result.returncode, result.stdout, result.stderr) == (3, "", f"ERROR: {line}\n")


@pytest.mark.parametrize("args", [("list",), ("status",), ("-m", "edgebuild", "schema")])
def test_a_reader_that_goes_away_ends_the_command_quietly(project_dir, args: tuple[str, ...]) -> None:
    """``doit list | head -1``: the reader closes the pipe; the command stops without a
    traceback (Python's own, on the failed write and again at exit), as other tools do."""
    import os
    import subprocess
    import sys

    project_dir.manifest(TOWER_MANIFEST)
    program = [sys.executable] if args[0] == "-m" else [str(Path(sys.executable).parent / "doit")]
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first line is written
    try:
        ended = subprocess.run([*program, *args], cwd=project_dir.root, stdout=writer, stderr=subprocess.PIPE, text=True,
                               timeout=300, env={key: value for key, value in os.environ.items() if key != "EDGEBUILD_MANIFEST"})
    finally:
        os.close(writer)
    assert (ended.returncode, ended.stderr) == (1, "")


# --- status -------------------------------------------------------------------------


@pytest.mark.slow
def test_list_shows_the_verify_group_and_its_subtasks_when_asked(project_dir) -> None:
    """A plain `doit list` shows the artifacts and the verify group (its subtasks are not
    even made); --all shows each verify:NAME, and a subtask may be named."""
    project_dir.manifest(TOWER_MANIFEST + ODD)

    def names(*args: str) -> list[str]:
        listed = project_dir.doit("list", "-q", *args)
        assert listed.returncode == 0, listed.stderr
        return [line.split()[0] for line in listed.stdout.splitlines()]

    assert names() == ["odd", "t", "verify"]
    assert names("--all") == ["odd", "t", "verify", "verify:odd", "verify:t"]
    assert names("verify:t") == ["verify:t"]
    assert names("--all", "verify") == ["verify", "verify:odd", "verify:t"]
    statuses = project_dir.doit("list", "--status")
    assert statuses.returncode == 0 and [line.split()[:2] for line in statuses.stdout.splitlines()] == [
        ["R", "odd"], ["R", "t"], ["R", "verify"]], statuses.stdout
    # A dodo file that asks for subtasks in its DOIT_CONFIG gets them from a plain `doit list`.
    dodo = project_dir.root / "dodo.py"
    dodo.write_text(dodo.read_text().replace("DOIT_CONFIG = doit_config(PROJECT)",
                                             'DOIT_CONFIG = {**doit_config(PROJECT), "subtasks": True}'))
    assert names() == ["odd", "t", "verify", "verify:odd", "verify:t"]


def test_status_exit_codes(project_dir) -> None:
    """`doit status` fails only for an artifact in error; `--check` for anything not up to date."""
    path = project_dir.manifest(TOWER_MANIFEST + ODD)
    result = project_dir.doit("status")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "t    missing"
    assert lines[1] == "odd  error"
    assert lines[2].startswith(
        f"       - {path.name}:12:5: artifacts -> odd -> image_size: height 450 is not a multiple of patch_size x "
        "spatial_merge_size = 16 x 2 = 32; nearest valid sizes: 448, 480"
    )
    assert result.stderr == "edgebuild: status: 1 error, 1 missing (of 2)\n"

    missing = project_dir.doit("status", "t")
    assert (missing.returncode, missing.stdout, missing.stderr) == (0, "t  missing\n", "")
    checked = project_dir.doit("status", "--check", "t")
    assert (checked.returncode, checked.stdout, checked.stderr) == (1, "t  missing\n", "edgebuild: status: 1 missing (of 1)\n")
    as_json = project_dir.doit("status", "--json", "--check", "t")
    assert as_json.returncode == 1
    assert [state["state"] for state in json.loads(as_json.stdout)] == ["missing"]


@pytest.mark.slow
def test_status_sees_an_output_edited_in_place_and_check_wants_verified(project_dir) -> None:
    """An output edited in place, same size, its mtime put back: status says stale, as the
    build would (the stat key holds ctime and the inode too). And ``--check`` fails on
    "up to date (not verified)": a CI gate passes only what is verified now."""
    import os

    from edgebuild.core.hashing import file_digest
    from helpers import pretend_built

    project_dir.manifest(TOWER_MANIFEST)
    output = project_dir.root / "build" / "t" / "model.onnx"
    output.parent.mkdir(parents=True)
    output.write_bytes(b"an onnx graph")
    pretend_built(project_dir.project(), "t", {"model.onnx": file_digest(output)})
    fresh = project_dir.doit("status", "t")
    assert (fresh.returncode, fresh.stdout) == (0, "t  up to date (not verified)\n"), fresh.stderr
    checked = project_dir.doit("status", "--check", "t")
    assert (checked.returncode, checked.stdout, checked.stderr) == (
        1, "t  up to date (not verified)\n", "edgebuild: status: 1 up to date (not verified) (of 1)\n")

    stamp = output.stat()
    with open(output, "r+b") as handle:
        handle.write(b"AN")
    os.utime(output, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert output.stat().st_size == stamp.st_size and output.stat().st_mtime_ns == stamp.st_mtime_ns
    edited = project_dir.doit("status", "t")
    assert edited.returncode == 0
    assert edited.stdout == "t  stale\n     - model.onnx changed or missing since the build\n"


# --- from a subdirectory -------------------------------------------------------------


@pytest.mark.slow
def test_every_command_works_from_a_subdirectory_with_k(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    deep = project.root / "src" / "deep"
    deep.mkdir(parents=True)

    status = project.doit("-k", "status", "--check", cwd=deep)
    assert (status.returncode, status.stdout, status.stderr) == (0, "t  up to date (verified)\n", "")
    verify = project.doit("-k", "verify", cwd=deep)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout == "-- t\n-- verify:t\nverify: 1 passed, 0 failed, 0 not run\n"
    build = project.doit("-k", "build", "t", cwd=deep)
    assert (build.returncode, build.stdout) == (0, "-- t\n")
    listed = project.doit("-k", "cache", cwd=deep)
    assert listed.returncode == 0 and listed.stdout.startswith("local store (cache/store): 1 entry, ")
    assert project.doit("-k", "gc", cwd=deep).returncode == 0
    # Nothing was written where the commands ran.
    assert list(deep.iterdir()) == []
    # Without -k, doit looks in the current directory only.
    lost = project.doit("status", cwd=deep)
    assert lost.returncode == 3
    assert lost.stderr.startswith(f"ERROR: Could not find dodo file '{deep / 'dodo.py'}'.")


# --- verify goes on -------------------------------------------------------------------


@pytest.mark.slow
def test_verify_goes_on_after_a_failure_and_sums_up(verified_seed: Path, tmp_path: Path) -> None:
    """odd's build fails (image size), strict's verification fails (a provider that is
    not there), q's build fails (more layers than the model has), so q_onnx is not run;
    t still passes, and strict is verified although odd failed before it."""
    project = clone_project(verified_seed, tmp_path / "clone")
    (project.root / "images").mkdir()
    (project.root / "images" / "a.png").write_bytes((REPO / "data" / "calibration" / "scene_000.png").read_bytes())
    project.manifest(
        TOWER_MANIFEST.replace("checkpoints:\n", "checkpoints:\n  siglip:\n    fixture: siglip_tiny\n")
        + ODD + STRICT
        + "  q:\n    kind: siglip_f143\n    checkpoint: siglip\n    layers: 5\n    calibration:\n      images: [images/a.png]\n"
        + "  q_onnx:\n    kind: siglip_f143_onnx\n    source: q\n"
    )
    result = project.doit("verify")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "verify: 1 passed, 3 failed (odd, strict, q), 1 not run (q_onnx)"
    assert "strict: verification failed: provider:DmlExecutionProvider" in result.stdout + result.stderr
    assert json.loads((project.root / "build" / "strict" / "report.json").read_text())["passed"] is False
    # The lock holds what is built: t (verified) and strict (built, verification failed).
    lock = json.loads((project.root / "artifacts.lock").read_text())["artifacts"]
    assert {name: entry["verified"] for name, entry in lock.items()} == {"t": True, "strict": False}

    fail_fast = project.doit("verify", "--fail-fast", "odd", "q_onnx", "t")
    assert fail_fast.returncode != 0
    assert fail_fast.stdout.splitlines()[-1] == "verify: 0 passed, 1 failed (odd), 2 not run (q_onnx, t)"


# --- what is kept ---------------------------------------------------------------------

AGE = r"\d+(\.\d)? (s|min) ago"


@pytest.mark.slow
def test_cache_lists_the_store_and_the_remote_and_gc_names_artifacts(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    fingerprint = project.project().artifact("t").fingerprint
    remote = tmp_path / "remote"
    remote.mkdir()
    env = {"EDGEBUILD_REMOTE_CACHE": str(remote)}
    assert project.doit("verify", env=env).returncode == 0  # pushes t

    listed = project.doit("cache", env=env)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert re.fullmatch(r"local store \(cache/store\): 1 entry, \d+\.\d MiB", lines[0]), lines[0]
    assert re.fullmatch(r"  ARTIFACT  FINGERPRINT   SIZE +LAST USED", lines[1]), lines[1]
    assert re.fullmatch(rf"  t         {fingerprint[:12]}  \d+\.\d MiB  {AGE} +current", lines[2]), lines[2]
    assert lines[3] == f"remote cache ({remote}): 1 entry, " + lines[0].split(", ")[1]
    assert re.fullmatch(r"  ARTIFACT  FINGERPRINT   SIZE +PUSHED", lines[4]), lines[4]
    assert re.fullmatch(rf"  t         {fingerprint[:12]}  \d+\.\d MiB  {AGE} +current", lines[5]), lines[5]
    assert len(lines) == 6
    entries = json.loads(project.doit("cache", "--json", env=env).stdout)
    assert [(section["where"], [(entry["artifact"], entry["fingerprint"], entry["current"]) for entry in section["entries"]])
            for section in entries] == [("local store", [("t", fingerprint, True)]), ("remote cache", [("t", fingerprint, True)])]

    # A bare gc says what the store holds and what to pass; it removes nothing.
    bare = project.doit("gc")
    assert bare.returncode == 0
    assert re.fullmatch(
        r"the store holds 1 entries in (\d+\.\d MiB) of blobs \(1 current, \1\)\n"
        r"to prune it, give --max-size and/or --max-age \(e\.g\. doit gc --max-age 30d; --dry-run to preview\)\n",
        bare.stdout,
    ), bare.stdout
    # Once t's build is not the current one, gc may remove it, and names it.
    project.manifest(TOWER_MANIFEST + "    opset: 20\n")
    dry = project.doit("gc", "--max-size", "0", "--dry-run")
    assert dry.returncode == 0
    assert re.fullmatch(
        rf"would remove t {fingerprint[:12]} \((\d+\.\d MiB), last used {AGE}\)\nwould remove 1 entry, freeing \1\n", dry.stdout
    ), dry.stdout
    assert project.project().store.has(fingerprint)
    removed = project.doit("gc", "--max-size", "0")
    assert removed.stdout.startswith(f"removed t {fingerprint[:12]} (")
    assert not project.project().store.has(fingerprint)


# --- where outputs go ----------------------------------------------------------------


@pytest.mark.slow
def test_outputs_and_lock_are_beside_the_manifest(project_dir, tmp_path: Path) -> None:
    """Another manifest in another directory: build/, cache/ and <stem>.lock go beside
    it, not into the directory the command runs from."""
    release = project_dir.root / "release"
    release.mkdir()
    (release / "edge.yml").write_text(TOWER_MANIFEST)
    result = project_dir.doit("build", env={"EDGEBUILD_MANIFEST": "release/edge.yml"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert (release / "build" / "t" / "model.onnx").is_file()
    assert (release / "cache" / "store").is_dir()
    assert list(json.loads((release / "edge.lock").read_text())["artifacts"]) == ["t"]
    assert sorted(path.name for path in project_dir.root.iterdir()) == ["dodo.py", "release"]


@pytest.mark.slow
def test_a_failed_build_leaves_the_lock_as_it_was(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "clone")
    lock = project.root / "artifacts.lock"
    before = lock.read_bytes()
    # t cannot build at 450: its entry (of the build still in build/t) stays, odd gets none.
    project.manifest(TOWER_MANIFEST.replace("image_size: 64", "image_size: 450") + ODD)
    result = project.doit("build", "--continue")
    assert result.returncode != 0
    assert lock.read_bytes() == before
