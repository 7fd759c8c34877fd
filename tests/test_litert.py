"""Kind ``litert``: a model's program converted to a ``.tflite`` by litert-torch (in an
environment of its own), run in LiteRT's interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild.errors import ParameterError
from edgebuild.run.workspace import Workspace

from test_targets import CLIP


def test_a_missing_converter_is_one_line_naming_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("litert_torch") is not None:
        pytest.fail("litert-torch imports in edgebuild's environment; the test set-up keeps it in its own")
    monkeypatch.setenv("EDGEBUILD_LITERT_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    (tmp_path / "artifacts.yaml").write_text(CLIP)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    with pytest.raises(ParameterError) as caught:
        workspace.check("clip_tflite")
    assert str(caught.value).endswith(
        f"artifacts -> clip_tflite -> kind: the litert kind converts with litert_torch runs in an environment of its "
        f"own, and there is none at {tmp_path / 'nowhere' / 'bin' / 'python'}: python -m edgebuild toolenv litert makes "
        "it (or set EDGEBUILD_LITERT_PYTHON)")


def test_the_converters_versions_are_in_the_fingerprint(tmp_path: Path) -> None:
    from edgebuild.ml.toolenv import tool_versions

    from helpers import pretend_built

    (tmp_path / "artifacts.yaml").write_text(CLIP)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    pretend_built(workspace, "clip_et.torch_export")
    versions = workspace.record("clip_tflite").versions
    assert versions["litert:litert-torch"] == tool_versions("litert")["litert:litert-torch"] == "0.10.0"
    assert versions["ai-edge-litert"] == "2.3.0"


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = ["edgebuild/core/model_inputs.py", "edgebuild/kinds/torch_export/params.py", "edgebuild/kinds/torch_export/targets.py"]
    assert_code_digests("litert", build=[*common, "edgebuild/core/runner.py", "edgebuild/kinds/litert/build.py", "edgebuild/kinds/litert/convert.py", "edgebuild/kinds/litert/params.py"],
                        verify=[*common, "edgebuild/ml/programs.py", "edgebuild/kinds/torch_export/judging.py", "edgebuild/kinds/litert/params.py", "edgebuild/kinds/litert/verify.py"])
