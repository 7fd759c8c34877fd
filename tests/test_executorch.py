"""Kind ``executorch``: a model's program lowered to a ``.pte`` (XNNPACK, portable),
executed in ExecuTorch's runtime. (Every target together, with transformers as the
reference: tests/test_targets.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import lay_out_project


@pytest.mark.slow
def test_the_portable_kernels_alone(tmp_path: Path) -> None:
    manifest = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  portable:
    kind: executorch
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
    delegate: portable
"""
    project = lay_out_project(tmp_path, manifest)
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    delegation = json.loads((tmp_path / "build" / "portable" / "executorch.json").read_text())
    assert (delegation["delegate"], delegation["delegated_nodes"], delegation["delegated_subgraphs"]) == ("portable", 0, 0)
    report = json.loads((tmp_path / "build" / "portable" / "report.json").read_text())
    checks = {check["name"]: check["value"] for check in report["checks"]}
    assert checks["level"] == "ran" and checks["vs_float.pooler_output.cosine"] > 0.9999


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = ["edgebuild/core/model_inputs.py", "edgebuild/kinds/torch_export/params.py", "edgebuild/kinds/torch_export/targets.py"]
    assert_code_digests("executorch", build=[*common, "edgebuild/core/runner.py", "edgebuild/ml/programs.py", "edgebuild/kinds/executorch/build.py", "edgebuild/kinds/executorch/params.py"],
                        verify=[*common, "edgebuild/ml/programs.py", "edgebuild/kinds/torch_export/judging.py", "edgebuild/kinds/executorch/params.py", "edgebuild/kinds/executorch/verify.py"])
