"""Kind ``openvino``: a model's program as OpenVINO IR (float, or INT8 by NNCF), run on
the CPU plugin in float32. (Dynamic axes and INT8: tests/test_targets.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.errors import ManifestError

from test_targets import CLIP


def test_calibration_is_for_int8(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(CLIP.replace("    kind: openvino\n", "    kind: openvino\n"
                                                          "    calibration: {images: [images/*.png]}\n"))
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    assert str(caught.value).endswith("artifacts -> clip_ov: calibration is for quantize: int8")


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = ["edgebuild/core/model_inputs.py", "edgebuild/kinds/torch_export/params.py", "edgebuild/kinds/torch_export/targets.py"]
    assert_code_digests("openvino", build=[*common, "edgebuild/core/runner.py", "edgebuild/core/inputs.py", "edgebuild/ml/graph_inputs.py", "edgebuild/ml/hf.py", "edgebuild/ml/images.py", "edgebuild/ml/programs.py", "edgebuild/kinds/openvino/build.py", "edgebuild/kinds/openvino/params.py"],
                        verify=[*common, "edgebuild/ml/graph_inputs.py", "edgebuild/ml/hf.py", "edgebuild/ml/programs.py", "edgebuild/kinds/torch_export/judging.py", "edgebuild/kinds/openvino/params.py", "edgebuild/kinds/openvino/verify.py"])
