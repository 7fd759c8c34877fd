"""The doit commands end to end, in throwaway project directories: real exports,
real onnxruntime verification."""

from __future__ import annotations

import json

import pytest

from helpers import TOWER_MANIFEST

pytestmark = pytest.mark.slow

FIXTURE_HEAD = """\
version: 1
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
"""


def test_build_noop_verify_list(project_dir) -> None:
    project_dir.manifest(
        FIXTURE_HEAD
        + """\
  tower_448_fp32:
    kind: qwen3_5_vision_tower
    description: the tower at 448
    checkpoint: qwen
    image_size: 448
    dtype: fp32
"""
    )
    listed = project_dir.doit("list")
    assert listed.returncode == 0, listed.stderr
    assert "tower_448_fp32   [qwen3_5_vision_tower] the tower at 448" in listed.stdout

    built = project_dir.doit("build", "tower_448_fp32")
    assert built.returncode == 0, built.stderr + built.stdout
    assert ".  tower_448_fp32" in built.stdout
    model = project_dir.root / "build" / "tower_448_fp32" / "model.onnx"
    assert model.is_file() and (model.parent / "model.onnx.data").is_file()
    stamp = model.stat().st_mtime_ns

    again = project_dir.doit("build", "tower_448_fp32")
    assert again.returncode == 0, again.stderr
    assert "-- tower_448_fp32" in again.stdout
    assert model.stat().st_mtime_ns == stamp

    verified = project_dir.doit("verify")
    assert verified.returncode == 0, verified.stderr + verified.stdout
    report = json.loads((model.parent / "report.json").read_text())
    assert report["passed"] is True
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["cosine"]["value"] >= 0.9999 and checks["cosine"]["limit"] == 0.9999
    assert checks["max_abs"]["value"] <= 1e-4
    assert checks["input_shape"]["value"] == ["patches", "float", [784, 1536]]
    assert checks["output_shape"]["value"] == ["embeds", "float", [196, 96]]
    assert checks["allowzero_reshapes"]["value"] == 0
    assert report["metrics"]["graph"]["ops"].get("Gather", 0) == 0
    assert report["build"]["allowzero_cleared"] > 0
    assert (model.parent / "report.md").read_text().startswith("# tower_448_fp32 (qwen3_5_vision_tower): PASSED")

    unchanged = project_dir.doit("verify")
    assert "-- verify:tower_448_fp32" in unchanged.stdout


def test_failing_verification_exits_nonzero(project_dir) -> None:
    project_dir.manifest(
        FIXTURE_HEAD
        + """\
  strict:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 224
    dtype: fp16
    verify:
      max_abs: 0.0
"""
    )
    result = project_dir.doit("verify", "strict")
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "strict: verification failed: max_abs = " in output
    assert "(limit <= 0)" in output
    report = json.loads((project_dir.root / "build" / "strict" / "report.json").read_text())
    assert report["passed"] is False
    assert [check["name"] for check in report["checks"] if not check["passed"]] == ["max_abs"]


def test_bad_manifest_touches_nothing(project_dir) -> None:
    existing = project_dir.root / "build" / "t" / "model.onnx"
    existing.parent.mkdir(parents=True)
    existing.write_text("previous output")
    path = project_dir.manifest(FIXTURE_HEAD + "  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_sise: 448\n")
    result = project_dir.doit("build", "t")
    assert result.returncode == 2
    assert result.stderr == (
        f"edgebuild: error: {path.name}:6:3: artifacts -> t -> image_size: missing required key 'image_size'\n"
        f"{path.name}:9:5: artifacts -> t -> image_sise: unknown key 'image_sise' (did you mean 'image_size'?)\n"
    )
    assert "Traceback" not in result.stdout + result.stderr
    assert existing.read_text() == "previous output"


def test_impossible_image_size_fails_before_writing(project_dir) -> None:
    project_dir.manifest(FIXTURE_HEAD + "  odd:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 450\n")
    result = project_dir.doit("build", "odd")
    assert result.returncode != 0
    assert (
        "artifacts.yaml:9:5: artifacts -> odd -> image_size: height 450 is not a multiple of patch_size x "
        "spatial_merge_size = 16 x 2 = 32; nearest valid sizes: 448, 480 (vision_config of checkpoint 'qwen' ("
    ) in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (project_dir.root / "build" / "odd").exists()


def test_unknown_artifact_has_hint(project_dir) -> None:
    project_dir.manifest(FIXTURE_HEAD + "  tower:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 448\n")
    result = project_dir.doit("build", "towr")
    assert result.returncode == 3
    assert "unknown artifact 'towr' (did you mean 'tower'?)" in result.stderr


def test_another_tower_config_builds_without_code_change(project_dir) -> None:
    """Different depth, widths, heads, patch size and merge size, a rectangular image."""
    project_dir.manifest(
        """\
checkpoints:
  other:
    fixture: qwen3_5_vl_tiny
    fixture_config:
      vision_config:
        depth: 3
        hidden_size: 48
        intermediate_size: 80
        num_heads: 3
        patch_size: 14
        spatial_merge_size: 3
        out_hidden_size: 40
        num_position_embeddings: 100
artifacts:
  other_tower:
    kind: qwen3_5_vision_tower
    checkpoint: other
    image_size: [126, 168]
"""
    )
    result = project_dir.doit("verify", "other_tower")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((project_dir.root / "build" / "other_tower" / "report.json").read_text())
    checks = {check["name"]: check["value"] for check in report["checks"]}
    # 126x168 at patch 14: a 9x12 grid, 108 patches of 3*2*14*14; merge 3: 12 tokens.
    assert checks["input_shape"] == ["patches", "float", [108, 1176]]
    assert checks["output_shape"] == ["embeds", "float", [12, 40]]
    assert report["passed"] is True


def test_parallel_build(project_dir) -> None:
    """``-n 2`` once hung: workers forked after torch was imported deadlock in its thread pool."""
    project_dir.manifest(
        FIXTURE_HEAD
        + "  t_{image_size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n      image_size: [64, 96]\n"
    )
    result = project_dir.doit("build", "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.count("] built in") == 2
    assert (project_dir.root / "build" / "t_64" / "model.onnx").is_file()
    assert (project_dir.root / "build" / "t_96" / "model.onnx").is_file()


def test_quiet_unless_asked(project_dir) -> None:
    """edgebuild's own lines only; doit's per-action clean lines with -v or EDGEBUILD_VERBOSE=1
    (the exporter's chatter: tests/test_scaffold.py, whose SigLIP export logs some)."""
    project_dir.manifest(TOWER_MANIFEST)
    quiet = project_dir.doit("build")
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert quiet.stdout == ".  t\n"
    assert [line for line in quiet.stderr.splitlines() if not line.startswith("  [t] ")] == []

    cleaned = project_dir.doit("clean", "t")
    assert (cleaned.returncode, cleaned.stdout, cleaned.stderr) == (0, "removed build/t\n", "")
    assert project_dir.doit("build").returncode == 0  # restored from the store
    told = project_dir.doit("clean", "-v", "t")
    assert told.stdout == "t - executing 'Python: function _clean_action'\nremoved build/t\n"
    assert not (project_dir.root / "build" / "t").exists()
    assert project_dir.doit("build").returncode == 0
    told = project_dir.doit("clean", "t", env={"EDGEBUILD_VERBOSE": "1"})
    assert told.stdout == "t - executing 'Python: function _clean_action'\nremoved build/t\n"
