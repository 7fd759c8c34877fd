"""Kinds from other packages: an entry point of the group ``edgebuild.kinds`` and the
``edgebuild.plugin`` surface are all a plugin needs. It builds and verifies like a
built-in kind, goes stale when its own code or version changes, shows in the schema;
a broken one is one line, and only for a manifest that uses it.

The plugins here are laid out as an installed distribution is (a package and its
``*.dist-info`` on the path), in a directory of their own; the repository's example
plugin (``examples/safetensors-subset``) is installed by the test set-up and has
tests of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgebuild.testing import TinyProject

from helpers import lay_out_plugin, vision_config_kind

# A kind whose build imports a module of its own package (render.py): editing it must
# make the artifact stale.
PLUGIN = vision_config_kind("vc_plugin", "vision_config_plugin", extra_build_module=True)
MANIFEST = "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\nartifacts:\n  vc:\n    kind: vision_config_plugin\n    checkpoint: qwen\n"
TOWER_ONLY = "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\nartifacts:\n  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"


@pytest.fixture
def plugin(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = lay_out_plugin(tmp_path / "site")
    return root, {"PYTHONPATH": str(root)}


def test_a_plugin_kind_is_listed_and_in_the_schema(plugin: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = plugin
    project = TinyProject(tmp_path / "project")
    project.manifest(MANIFEST)
    listed = project.doit("list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("vc       [vision_config_plugin] a checkpoint's vision_config as JSON\n")
    schema = subprocess.run([sys.executable, "-m", "edgebuild", "schema"], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert schema.returncode == 0, schema.stderr
    document = json.loads(schema.stdout)
    assert "vision_config_plugin" in document["$defs"]["Artifact"]["properties"]["kind"]["enum"]
    assert "VisionConfigParams" in document["$defs"]


@pytest.mark.slow
def test_a_plugin_kind_builds_verifies_and_goes_stale_on_its_own_code(plugin: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    root, env = plugin
    project = TinyProject(tmp_path / "project")
    project.manifest(MANIFEST)
    verified = project.doit("verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: 1 passed, 0 failed, 0 not run" in verified.stdout
    assert project.doit("status", env=env).stdout == "vc  up to date (verified)\n"
    record = json.loads((project.root / "build" / "vc" / ".edgebuild.json").read_text())
    # Its own package, by package-relative path, and edgebuild's kind interface.
    assert {"vc_plugin/build.py", "vc_plugin/render.py", "edgebuild/core/kind.py"} <= set(record["code"])
    assert "vc_plugin/verify.py" not in record["code"]
    assert record["versions"]["vc-plugin"] == "1.0"

    # A module its build imports changes: stale, and it says which.
    (root / "vc_plugin" / "render.py").write_text(PLUGIN["render.py"] + "\n\ndef _unused():\n    pass\n")
    stale = project.doit("status", env=env)
    assert stale.stdout == "vc  stale\n      - vc_plugin/render.py changed\n"
    # Its version changes: stale too.
    lay_out_plugin(root, version="1.1", files={"render.py": PLUGIN["render.py"]})
    assert project.doit("status", env=env).stdout == "vc  stale\n      - vc-plugin 1.0 → 1.1\n"
    rebuilt = project.doit("verify", env=env)
    assert rebuilt.returncode == 0 and "[vc] built in" in rebuilt.stderr


def test_a_broken_plugin_is_one_line_and_only_for_a_manifest_that_uses_it(tmp_path: Path) -> None:
    broken = dict(PLUGIN, **{"__init__.py": "import a_module_that_is_not_installed\n"})
    root = lay_out_plugin(tmp_path / "site", files=broken)
    env = {"PYTHONPATH": str(root)}
    project = TinyProject(tmp_path / "project")
    project.manifest(TOWER_ONLY)
    unaffected = project.doit("list", env=env)
    assert (unaffected.returncode, unaffected.stderr) == (0, "")
    path = project.manifest(MANIFEST)
    used = project.doit("list", env=env)
    assert used.returncode == 2
    assert used.stderr == (
        f"edgebuild: error: {path.name}:6:5: artifacts -> vc -> kind: entry point edgebuild.kinds: vision_config_plugin = "
        "vc_plugin:VisionConfig (from vc-plugin 1.0) failed to import: ModuleNotFoundError: No module named "
        "'a_module_that_is_not_installed'\n"
    )
    schema = subprocess.run([sys.executable, "-m", "edgebuild", "schema"], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert schema.returncode == 0
    assert schema.stderr.startswith("edgebuild: warning: entry point edgebuild.kinds: vision_config_plugin = ")
    assert schema.stderr.count("\n") == 1


def test_a_plugin_never_replaces_a_built_in_kind(tmp_path: Path) -> None:
    root = lay_out_plugin(tmp_path / "site", entry="qwen3_5_vision_tower = vc_plugin:VisionConfig")
    code = ("from edgebuild.core.registry import get_kind, shadowed_plugins; "
            "print(type(get_kind('qwen3_5_vision_tower')).__module__); print(shadowed_plugins())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "edgebuild.kinds.qwen3_5_tower", "['edgebuild.kinds: qwen3_5_vision_tower = vc_plugin:VisionConfig']"]


def test_the_example_plugins_are_installed() -> None:
    """The test set-up (the README's command) installs examples/safetensors-subset and
    examples/onnx-float16 (a target kind with a certificate of its own)."""
    from importlib.metadata import entry_points

    names = {point.name for point in entry_points(group="edgebuild.kinds")}
    for kind, folder in (("safetensors_subset", "safetensors-subset"), ("onnx_float16", "onnx-float16")):
        assert kind in names, (
            f"the example plugin is not installed: pip install -e ./examples/{folder} (the README's test command)")


def test_a_plugin_whose_kind_no_manifest_names_is_never_imported(tmp_path: Path) -> None:
    """An entry point's name is its kind's name: a command whose manifest does not name a
    plugin's kind never imports it, so a plugin that imports slowly (or not at all) costs
    `doit list`, `doit status` and `init` nothing. `init --plugins` asks for every one."""
    marker = tmp_path / "imported"
    broken = dict(PLUGIN, **{"__init__.py": f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
                                            "raise RuntimeError('this plugin is broken')\n"})
    root = lay_out_plugin(tmp_path / "site", files=broken)
    env = {"PYTHONPATH": str(root)}
    project = TinyProject(tmp_path / "project")
    project.manifest(TOWER_ONLY)
    for command in ("list", "status"):
        result = project.doit(command, env=env)
        assert (result.returncode, result.stderr) == (0, ""), command
    assert project.doit("status", env=env).stdout == "t  missing\n"

    def init(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgebuild", "init", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})

    started = init("fresh")
    assert (started.returncode, started.stderr) == (0, "")
    assert ("plugin kinds installed, not loaded: onnx_float16, safetensors_subset, vision_config_plugin "
            "(init --plugins writes their starters and parameters too)\n") in started.stdout
    assert not marker.exists()
    # Its kind is in init's schema by name (an editor takes it), its parameters unchecked.
    schema = json.loads((tmp_path / "fresh" / "edgebuild.schema.json").read_text())
    assert schema["$defs"]["Artifact"]["properties"]["kind"]["enum"][-3:] == [
        "onnx_float16", "safetensors_subset", "vision_config_plugin"]
    assert "VisionConfigParams" not in schema["$defs"]
    assert "tower_weights:" not in (tmp_path / "fresh" / "artifacts.yaml").read_text()

    asked = init("asked", "--plugins")
    assert asked.returncode == 0
    assert asked.stderr == (
        "edgebuild: warning: entry point edgebuild.kinds: vision_config_plugin = vc_plugin:VisionConfig (from vc-plugin "
        "1.0) failed to import: RuntimeError: this plugin is broken; its starter and parameters are left out\n"
    )
    assert marker.exists()
    assert "tower_weights:" in (tmp_path / "asked" / "artifacts.yaml").read_text()


LINKING_BUILD = '''
import json
import os

from edgebuild.plugin import BuildContext


def build(context: BuildContext) -> dict:
    section = json.dumps(context.checkpoint.config_section("vision_config"), sort_keys=True)
    outside = os.environ["OUTSIDE"]
    with open(outside, "w") as handle:
        handle.write(section)
    where = os.environ["LINK"]
    if where != "vision_config.json":
        (context.out_dir / "vision_config.json").write_text(section)
    (context.out_dir / where).parent.mkdir(parents=True, exist_ok=True)
    if where.endswith(".fifo"):
        os.mkfifo(context.out_dir / where)
    else:
        os.symlink(outside, context.out_dir / where)
    return {}
'''


@pytest.mark.slow
@pytest.mark.parametrize("where", ["vision_config.json", "deep/.hidden", "pipe.fifo"])
def test_a_link_a_kind_leaves_in_its_outputs_fails_the_build(tmp_path: Path, where: str) -> None:
    """A plugin's build that leaves a link among its outputs -- even to a file with the
    right bytes, even hidden, even deep -- or a FIFO: the build fails naming it, before
    anything is recorded, stored or renamed into build/."""
    root = lay_out_plugin(tmp_path / "site", files=dict(PLUGIN, **{"build.py": LINKING_BUILD}))
    outside = tmp_path / "outside.json"
    env = {"PYTHONPATH": str(root), "OUTSIDE": str(outside), "LINK": where, "EDGEBUILD_REMOTE_CACHE": "off"}
    project = TinyProject(tmp_path / "project")
    project.manifest(MANIFEST)
    built = project.doit("build", env=env)
    assert built.returncode != 0
    found = "a FIFO (named pipe)" if where.endswith(".fifo") else f"a symbolic link to {outside}"
    assert (f"\nvc: the vision_config_plugin build left {where} as {found}; outputs are regular files inside the build "
            "directory (nothing of this build was recorded or stored)\n") in built.stdout
    assert "Traceback" not in built.stdout + built.stderr
    assert not (project.root / "build" / "vc").exists()
    assert not (project.root / "cache" / "store" / "v1").exists()
    assert project.doit("status", env=env).stdout == "vc  missing\n"


@pytest.mark.slow
@pytest.mark.parametrize("ending, said", [
    ("sys.exit(0)", "vc: the build code called sys.exit(0) instead of returning; nothing of this build was kept"),
    ("os._exit(0)", "vc: the build process (pid N) exited with status 0 without handing back its result (code it ran "
                    "ended the process: os._exit?); nothing of it counts as built"),
    ("os._exit(3)", "vc: the build process (pid N) failed with exit status 3, with no traceback (code it ran ended the "
                    "process: os._exit, or a native library's crash); nothing of it counts as built"),
])
def test_a_build_that_ends_its_process_is_said_as_it_happened(tmp_path: Path, ending: str, said: str) -> None:
    """A kind's code that ends the worker itself, even with status 0, is no success, and
    no traceback is promised that was never printed."""
    build = f"import os\nimport sys\n\n\ndef build(context):\n    {ending}\n"
    root = lay_out_plugin(tmp_path / "site", files=dict(PLUGIN, **{"build.py": build}))
    env = {"PYTHONPATH": str(root), "EDGEBUILD_REMOTE_CACHE": "off"}
    project = TinyProject(tmp_path / "project")
    project.manifest(MANIFEST)
    built = project.doit("build", env=env)
    assert built.returncode != 0
    import re

    assert re.sub(r"\(pid \d+\)", "(pid N)", built.stdout).endswith(f"\n{said}\n\n"), built.stdout
    assert "Traceback" not in built.stdout + built.stderr
    assert project.doit("status", env=env).stdout == "vc  missing\n"


REFUSING_BUILD = '''
import os
from pathlib import Path

from edgebuild.plugin import BuildRejected


def build(context):
    with open(os.environ["TRIES"], "a") as tries:
        tries.write("try\\n")
    raise BuildRejected("the target's compiler has no kernel for node_Det_7 (Det, blocks.0.mlp)")
'''


@pytest.mark.slow
def test_a_build_its_target_refused_is_not_tried_again_until_its_fingerprint_changes(tmp_path: Path) -> None:
    """A kind's :class:`BuildRejected` (a QNN compile that failed) is remembered by
    fingerprint: the next build answers it without running the tool, status says it,
    EDGEBUILD_RETRY_REJECTED tries again, and a change of the fingerprint (here the kind's
    code) builds."""
    root = lay_out_plugin(tmp_path / "site", files=dict(PLUGIN, **{"build.py": REFUSING_BUILD}))
    tries = tmp_path / "tries"
    env = {"PYTHONPATH": str(root), "TRIES": str(tries), "EDGEBUILD_REMOTE_CACHE": "off"}
    project = TinyProject(tmp_path / "project")
    project.manifest(MANIFEST)
    first = project.doit("build", env=env)
    assert first.returncode != 0 and "no kernel for node_Det_7 (Det, blocks.0.mlp)" in first.stdout
    assert "Traceback" not in first.stdout + first.stderr
    second = project.doit("build", env=env)
    assert second.returncode != 0 and "no kernel for node_Det_7" in second.stdout
    assert "[refused at this fingerprint on " in second.stdout and "EDGEBUILD_RETRY_REJECTED=1" in second.stdout
    assert tries.read_text().count("try") == 1
    status = project.doit("status", env=env).stdout
    assert status.startswith("vc  missing (REFUSED at this fingerprint on ") and "node_Det_7" in status
    assert project.doit("status", "--check", env=env).returncode != 0
    retried = project.doit("build", env=dict(env, EDGEBUILD_RETRY_REJECTED="1"))
    assert retried.returncode != 0 and tries.read_text().count("try") == 2
    # The kind's code is in the fingerprint: fixed, it builds, and nothing refused is said.
    lay_out_plugin(tmp_path / "site")
    fixed = project.doit("build", env=env)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert project.doit("status", env=env).stdout.startswith("vc  up to date")


# --- kinds that run in the command's own process --------------------------------------

# An in_process kind, with a parameter (in the fingerprint) so that two artifacts are two builds.
IN_PROCESS_KIND = PLUGIN["__init__.py"].replace(
    '    verify_module = "vc_plugin.verify"\n', '    verify_module = "vc_plugin.verify"\n    process = Process(in_process=True)\n').replace(
    "    checkpoint: str\n", "    checkpoint: str\n    tag: int = 0\n")
PID_BUILD = PLUGIN["build.py"].replace("    return {}\n", "    import os\n\n    return {\"pid\": os.getpid()}\n")
PID_VERIFY = '''
import json
import os

from edgebuild.plugin import Check, Verification, VerifyContext


def verify(context: VerifyContext) -> Verification:
    if os.environ.get("RAISE_IN_VERIFY"):
        raise RuntimeError("a bug in the kind")
    written = json.loads((context.out_dir / "vision_config.json").read_text())
    same = written == context.checkpoint.config_section("vision_config")
    return Verification(checks=[Check.measure("matches_the_checkpoint", int(same), "==", 1)],
                        metrics={"pid": os.getpid()})
'''
TWO_ARTIFACTS = MANIFEST + "  vc2:\n    kind: vision_config_plugin\n    checkpoint: qwen\n    tag: 2\n"


def test_an_in_process_kind_builds_and_verifies_in_the_command_s_own_process(tmp_path: Path) -> None:
    """No worker: both builds and both verifications of one command ran in one process,
    which a worker per step would not (each worker is a process of its own)."""
    files = dict(PLUGIN, **{"__init__.py": IN_PROCESS_KIND, "build.py": PID_BUILD, "verify.py": PID_VERIFY})
    root = lay_out_plugin(tmp_path / "site", files=files)
    env = {"PYTHONPATH": str(root), "EDGEBUILD_REMOTE_CACHE": "off"}
    project = TinyProject(tmp_path / "project")
    project.manifest(TWO_ARTIFACTS)
    verified = project.doit("verify", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "verify: 2 passed, 0 failed, 0 not run" in verified.stdout
    pids = set()
    for name in ("vc", "vc2"):
        directory = project.root / "build" / name
        pids.add(json.loads((directory / ".edgebuild.json").read_text())["build_info"]["pid"])
        pids.add(json.loads((directory / "report.json").read_text())["metrics"]["pid"])
    assert len(pids) == 1, pids
    assert project.doit("status", env=env).stdout == "vc   up to date (verified)\nvc2  up to date (verified)\n"

    # A bug in its code: the traceback, then one line naming the artifact; nothing kept as verified.
    (project.root / "build" / "vc" / "report.json").unlink()
    failed = project.doit("verify", "vc", env=dict(env, RAISE_IN_VERIFY="1"))
    assert failed.returncode != 0
    assert "RuntimeError: a bug in the kind" in failed.stderr
    assert ("vc: the vision_config_plugin verify raised RuntimeError in this process (the kind runs in_process; its "
            "traceback is above)") in failed.stdout
    assert project.doit("status", "vc", env=env).stdout.startswith("vc  up to date (not verified)")
