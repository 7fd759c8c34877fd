"""Precise staleness: exactly what changed is rebuilt, nothing else, and a no-op reads nothing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgebuild.run.builder import make_current
from edgebuild.run.state import is_built
from edgebuild.core.checkpoint import Checkpoint
from edgebuild.kinds.qwen3_5_tower import build as tower_build
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace
from edgebuild.core.staleness import explain
from edgebuild.cli.gc import parse_age, parse_size
from edgebuild.run.state import status

from helpers import flip_bits, flipped, settle


MANIFEST = """\
checkpoints:
  qwen:
    path: ckpt
artifacts:
  tower_a:
    kind: qwen3_5_vision_tower
    description: {description}
    checkpoint: qwen
    image_size: 64
    opset: {opset}
  tower_b:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: [64, 96]
"""


def write_manifest(root: Path, description: str = "first", opset: int = 21) -> None:
    (root / "artifacts.yaml").write_text(MANIFEST.format(description=description, opset=opset))


def fresh(root: Path) -> BuildGraph:
    """A new BuildGraph, as a new doit process would see it (nothing memoised)."""
    return Workspace.open(root / "artifacts.yaml", root)


def build_all(root: Path) -> dict[str, list[str]]:
    project = fresh(root)
    logs: dict[str, list[str]] = {}
    for name in project.manifest.order():
        messages: list[str] = []
        make_current(project, project.artifact(name), log=messages.append)
        logs[name] = messages
    project.save_caches()
    return logs


def exported(messages: list[str]) -> bool:
    return any(message.startswith("built in") for message in messages)


def patch_tensor_bytes(checkpoint: Path, tensor: str) -> None:
    """Flip the lowest mantissa bit of the first bf16 value of ``tensor`` in place
    (same size, new content, still a finite number)."""
    entry = Checkpoint(checkpoint).tensors[tensor]
    flip_bits(entry.file, entry.start, 0x01)


@pytest.fixture
def root(tmp_path: Path, qwen_checkpoint: Path) -> Path:
    shutil.copytree(qwen_checkpoint, tmp_path / "ckpt")
    write_manifest(tmp_path)
    settle()
    return tmp_path


@pytest.mark.slow
def test_only_what_changed_is_rebuilt(root: Path) -> None:
    logs = build_all(root)
    assert exported(logs["tower_a"]) and exported(logs["tower_b"])
    shard = root / "ckpt" / "model-00001-of-00002.safetensors"
    visual_bytes = sum(entry.nbytes for entry in Checkpoint(root / "ckpt").select(("model.visual.",)).values())
    assert visual_bytes < shard.stat().st_size

    # No-op: nothing built, nothing read.
    project = fresh(root)
    assert all(is_built(project, project.artifact(name)) for name in ("tower_a", "tower_b"))
    assert project.stat_cache.bytes_hashed == 0

    # Touch: nothing built; the tower's bytes (not the whole shard) hashed once.
    os.utime(shard, ns=(time.time_ns(), time.time_ns()))
    settle()
    project = fresh(root)
    assert all(is_built(project, project.artifact(name)) for name in ("tower_a", "tower_b"))
    assert project.stat_cache.bytes_hashed == visual_bytes
    project.save_caches()
    project = fresh(root)
    assert all(is_built(project, project.artifact(name)) for name in ("tower_a", "tower_b"))
    assert project.stat_cache.bytes_hashed == 0

    # A non-visual tensor in the shared shard: nothing stale.
    patch_tensor_bytes(root / "ckpt", "lm_head.weight")
    project = fresh(root)
    assert all(is_built(project, project.artifact(name)) for name in ("tower_a", "tower_b"))
    project.save_caches()

    # A visual tensor: both towers stale, with the tensor named; both re-export.
    patch_tensor_bytes(root / "ckpt", "model.visual.blocks.1.mlp.linear_fc1.weight")
    project = fresh(root)
    state = status(project, project.artifact("tower_a"))
    assert state.state == "stale"
    assert state.reasons == ("tensor model.visual.blocks.1.mlp.linear_fc1.weight changed",)
    logs = build_all(root)
    assert exported(logs["tower_a"]) and exported(logs["tower_b"])

    # An opset change: that artifact only.
    write_manifest(root, opset=20)
    project = fresh(root)
    assert status(project, project.artifact("tower_a")).reasons == ("opset 21 → 20",)
    assert status(project, project.artifact("tower_b")).state == "up to date"
    logs = build_all(root)
    assert exported(logs["tower_a"]) and logs["tower_b"] == ["up to date"]

    # Switching back restores from the store: no export.
    write_manifest(root, opset=21)
    logs = build_all(root)
    assert logs["tower_a"][0].startswith("restored from the store")
    assert logs["tower_b"] == ["up to date"]

    # A description is cosmetic: nothing stale.
    write_manifest(root, description="second")
    assert build_all(root) == {"tower_a": ["up to date"], "tower_b": ["up to date"]}


@pytest.mark.slow
def test_deleting_build_restores_without_exporting(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_all(root)
    first = (root / "build" / "tower_a" / "model.onnx").read_bytes()
    shutil.rmtree(root / "build")

    def no_export(context):
        raise AssertionError("exported although the store holds this fingerprint")

    monkeypatch.setattr(tower_build, "build", no_export)
    logs = build_all(root)
    assert all(messages[0].startswith("restored from the store") for messages in logs.values())
    assert (root / "build" / "tower_a" / "model.onnx").read_bytes() == first


@pytest.mark.slow
def test_corrupt_store_entry_is_dropped_and_rebuilt(root: Path) -> None:
    build_all(root)
    project = fresh(root)
    fingerprint = project.fingerprint(project.artifact("tower_a"))
    shutil.rmtree(root / "build")
    stored = project.store.files(fingerprint)["model.onnx.data"]
    # Same size, different bytes: only the digest can tell.
    data = flipped(stored.read_bytes(), 100)
    stored.unlink()
    stored.write_bytes(data)
    logs = build_all(root)
    assert exported(logs["tower_a"])
    # Named first, never repaired without a word: a stored file does not change by itself.
    from edgebuild.core.hashing import digest_bytes

    assert logs["tower_a"][0] == (
        f"warning: the store's build of {fingerprint[:12]} is damaged (model.onnx.data: digest "
        f"{digest_bytes(bytes(data))[:12]}, expected {stored.name[:12]}); stored files do not change by themselves: "
        f"check the disk under {project.store.root}, and who else writes there. It was dropped"
    )
    assert logs["tower_b"][0].startswith("restored from the store")


def test_a_matrix_reads_its_checkpoint_once_yet_sees_it_change(root: Path) -> None:
    """Artifacts on one checkpoint share what they read of it within a process (a
    10,000-artifact matrix selects and digests the tower's tensors once), but a tensor
    rewritten between two of them is in the next one's fingerprint: the memo holds only
    while every file it covers keeps its stat."""
    third = "  tower_c:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 96\n"
    (root / "artifacts.yaml").write_text(MANIFEST.format(description="first", opset=21) + third)
    project = fresh(root)
    first = project.record(project.artifact("tower_a")).inputs["checkpoint"]
    hashed = project.stat_cache.bytes_hashed
    assert hashed > 0
    assert project.record(project.artifact("tower_b")).inputs["checkpoint"] == first
    assert project.stat_cache.bytes_hashed == hashed

    tensor = "model.visual.blocks.0.attn.proj.weight"
    patch_tensor_bytes(root / "ckpt", tensor)
    changed = project.record(project.artifact("tower_c")).inputs["checkpoint"]
    assert changed["tensors"][tensor]["digest"] != first["tensors"][tensor]["digest"]
    assert {name for name in first["tensors"] if changed["tensors"][name] != first["tensors"][name]} == {tensor}
    # What a new process computes.
    assert fresh(root).artifact("tower_c").record.inputs["checkpoint"] == changed


def test_explain_names_code_and_tool_versions() -> None:
    built = {
        "kind": "k",
        "params": {"opset": 21, "verify": {}},
        "inputs": {
            "source": {"outputs": {"model.onnx": "a" * 64, "model.onnx.data": "c" * 64}},
            "checkpoint": {"config": "x", "config_key": "vision_config", "tensors": {}, "files": {"p.json": "1"}},
            "files:calibration.images": ["d1", "d2", "d3"],
            "files:held_out.images": ["h1", "h2"],
        },
        "code": {"edgebuild/kinds/qwen3_5_tower/build.py": "1", "edgebuild/report.py": "2"},
        "versions": {"transformers": "5.24.0", "torch": "2.13.0"},
        "fingerprint": "old",
    }
    current = {
        "kind": "k",
        "params": {"opset": 21, "verify": {}},
        "inputs": {
            "source": {"outputs": {"model.onnx": "a" * 64, "model.onnx.data": "d" * 64, "geometry.json": "e" * 64}},
            "checkpoint": {"config": "y", "config_key": "vision_config", "tensors": {}, "files": {"p.json": "2"}},
            "files:calibration.images": ["d1", "dX", "d3", "d4"],
            "files:held_out.images": ["h2", "h1"],
        },
        "inputs_named": {
            "source": "src",
            "checkpoint": "checkpoint 'q' (/models/q)",
            "files:calibration.images": ["a.png", "b.png", "c.png", "d.png"],
        },
        "code": {"edgebuild/kinds/qwen3_5_tower/build.py": "3", "edgebuild/report.py": "2", "edgebuild/new.py": "4"},
        "versions": {"transformers": "5.25.0", "torch": "2.13.0"},
        "fingerprint": "new",
    }
    expected = [
        "checkpoint 'q' (/models/q): config.json (vision_config) changed",
        "checkpoint 'q' (/models/q): p.json changed",
        "calibration.images: b.png changed",
        "calibration.images: d.png added",
        "held_out.images: the same files in another order",
        # By the source's output bytes (early cutoff): which of its files changed.
        "source artifact src: geometry.json added",
        "source artifact src: model.onnx.data changed",
        "edgebuild/kinds/qwen3_5_tower/build.py changed",
        "edgebuild/new.py added",
        "transformers 5.24.0 → 5.25.0",
    ]
    # A record that does not name its files is compared by position; one that does, by name.
    assert explain(built, current) == expected
    built["inputs_named"] = {"files:calibration.images": ["a.png", "b.png", "c.png"]}
    assert explain(built, current) == expected


def test_explain_compares_globbed_inputs_by_name_and_content() -> None:
    """Adding one image names that image, not every image sorted after it."""
    def record(named: list[str], digests: list[str]) -> dict:
        return {"kind": "k", "params": {}, "inputs": {"files:calibration.images": digests},
                "inputs_named": {"files:calibration.images": named}, "fingerprint": "-".join(digests)}

    before = record(["b.png", "c.png", "d.png", "e.png"], ["B", "C", "D", "E"])
    assert explain(before, record(["a.png", "b.png", "c.png", "d.png", "e.png"], ["A", "B", "C", "D", "E"])) == [
        "calibration.images: a.png added"]
    assert explain(before, record(["b.png", "d.png", "e.png"], ["B", "D", "E"])) == ["calibration.images: c.png removed"]
    assert explain(before, record(["b.png", "c.png", "d.png", "e.png"], ["B", "C2", "D", "E"])) == [
        "calibration.images: c.png changed"]
    # A rename alone changes no content (and no fingerprint); beside another change, it is named.
    assert explain(before, record(["b.png", "c.png", "d.png", "z.png"], ["B", "C2", "D", "E"])) == [
        "calibration.images: c.png changed", "calibration.images: e.png renamed z.png"]
    assert explain(before, record(["b.png", "c.png", "d.png", "e.png"], ["C", "B", "D", "E"])) == [
        "calibration.images: b.png changed", "calibration.images: c.png changed"]


@pytest.mark.slow
def test_gc_keeps_current_and_drops_least_recently_used(root: Path) -> None:
    build_all(root)
    write_manifest(root, opset=20)
    build_all(root)
    project = fresh(root)
    entries = {entry.fingerprint: entry for entry in project.store.entries()}
    assert len(entries) == 3
    keep = {project.fingerprint(project.artifact("tower_a")), project.fingerprint(project.artifact("tower_b"))}
    removed = project.store.gc(max_bytes=0, max_age_seconds=None, keep=keep).removed
    assert len(removed) == 1 and removed[0].fingerprint not in keep
    assert {entry.fingerprint for entry in project.store.entries()} == keep
    # Every blob left is one a kept entry reaches.
    reached = {digest for entry in project.store.entries() for digest, _ in entry.blobs}
    assert set(project.store.blobs()) == reached


def test_size_and_age_parsing() -> None:
    assert parse_size("500M") == 500 * 2**20
    assert parse_size("1.5g") == int(1.5 * 2**30)
    assert parse_age("12h") == 43200
    assert parse_age("30d") == 30 * 86400
    with pytest.raises(ValueError, match=r"--max-size: expected a size like 500M or 20G, found 'lots'"):
        parse_size("lots")


def _doit(project_dir, *args: str) -> subprocess.Popen[str]:
    doit = Path(sys.executable).with_name("doit")
    return subprocess.Popen(
        [str(doit), *args], cwd=project_dir.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_sigkill_mid_build_leaves_nothing_built(project_dir, qwen_checkpoint: Path) -> None:
    shutil.copytree(qwen_checkpoint, project_dir.root / "ckpt")
    write_manifest(project_dir.root)
    process = _doit(project_dir, "build", "tower_a")
    # Kill once the export has started: the scratch directory exists, the record does not.
    deadline = time.monotonic() + 120
    scratch = project_dir.root / "build" / ".tmp"
    while time.monotonic() < deadline:
        if scratch.is_dir() and any(path.name.startswith("tower_a~") for path in scratch.iterdir()):
            break
        time.sleep(0.05)
    else:
        process.kill()
        pytest.fail("the build never started")
    time.sleep(1.0)
    process.send_signal(signal.SIGKILL)
    process.wait()
    project = fresh(project_dir.root)
    assert not is_built(project, project.artifact("tower_a"))
    assert not project.store.has(project.fingerprint(project.artifact("tower_a")))
    assert status(project, project.artifact("tower_a")).state == "missing"

    again = project_dir.doit("build", "tower_a")
    assert again.returncode == 0, again.stderr
    assert "built in" in again.stderr
    fresh_project = fresh(project_dir.root)
    assert is_built(fresh_project, fresh_project.artifact("tower_a"))
    # The killed build's scratch directory is gone.
    assert not any(path.name.startswith("tower_a~") for path in scratch.iterdir())


@pytest.mark.slow
def test_two_processes_build_once(project_dir, qwen_checkpoint: Path) -> None:
    shutil.copytree(qwen_checkpoint, project_dir.root / "ckpt")
    write_manifest(project_dir.root)
    first, second = _doit(project_dir, "build", "tower_a"), _doit(project_dir, "build", "tower_a")
    outputs = [process.communicate(timeout=300) for process in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, outputs
    stderr = "".join(error for _, error in outputs)
    assert stderr.count("built in") == 1
    assert stderr.count("[tower_a] up to date") == 1
    fresh_project = fresh(project_dir.root)
    assert is_built(fresh_project, fresh_project.artifact("tower_a"))
