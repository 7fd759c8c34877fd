"""Kind ``ort_format``: an ONNX artifact's graph in onnxruntime's ORT format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import lay_out_project


@pytest.mark.slow
def test_runtime_optimizations_and_the_operators_a_reduced_build_needs(tmp_path: Path) -> None:
    manifest = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  clip_onnx:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
  clip_ort:
    kind: ort_format
    source: clip_onnx
    optimization: runtime
"""
    project = lay_out_project(tmp_path, manifest)
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads((tmp_path / "build" / "clip_ort" / "ort.json").read_text())["optimization"] == "runtime"
    operators = (tmp_path / "build" / "clip_ort" / "required_operators.config").read_text()
    assert "ai.onnx;" in operators and "MatMul" in operators
    # Its header names the model, not the build's scratch directory.
    named = [line[4:] for line in operators.splitlines() if line.startswith("# - ")]
    assert "model.ort" in named and all("/" not in name for name in named) and str(tmp_path) not in operators
    report = json.loads((tmp_path / "build" / "clip_ort" / "report.json").read_text())
    assert {check["name"] for check in report["checks"]} >= {"pooler_output.cosine", "vs_float.pooler_output.cosine"}


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = [
        "edgebuild/kinds/ort_format/params.py",
    ]
    assert_code_digests(
        "ort_format",
        build=[*common,
               "edgebuild/kinds/ort_format/build.py",
               "edgebuild/kinds/ort_format/canonical.py"],
        verify=[*common,
                "edgebuild/kinds/ort_format/verify.py"],
    )
