"""Kind ``openvino``: a model's program as OpenVINO IR (float, or INT8 by NNCF), run on
the CPU plugin in float32. (Dynamic axes and INT8: tests/test_targets.py.)"""

from __future__ import annotations

import logging
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

    common = [
        "edgebuild/kinds/openvino/params.py", "edgebuild/models/fields.py", "edgebuild/models/graph_inputs.py",
        "edgebuild/models/hf.py", "edgebuild/models/inputs.py", "edgebuild/targets/formats.py",
        "edgebuild/targets/params.py", "edgebuild/targets/program.py",
    ]
    assert_code_digests(
        "openvino",
        build=[*common,
               "edgebuild/core/inputs.py", "edgebuild/core/runner.py", "edgebuild/kinds/openvino/build.py",
               "edgebuild/ml/images.py"],
        verify=[*common,
                "edgebuild/kinds/openvino/coverage.py", "edgebuild/kinds/openvino/verify.py",
                "edgebuild/targets/judging.py"],
    )


def test_openvino_s_notes_on_the_root_logger_stay_off_the_terminal(caplog: pytest.LogCaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO's PyTorch frontend logs a warning with a traceback on the root logger for
    each decomposition it does not find, the first time a process converts a program (a
    build's worker): quieted as the libraries' other chatter is, the kind naming it among
    the libraries its steps run (its errors would still show), shown with the verbose setting."""
    import torch
    from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder

    from edgebuild.core.console import quieted
    from edgebuild.core.registry import get_kind

    libraries = get_kind("openvino").process.quiet_loggers

    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    with caplog.at_level(logging.WARNING):
        # Its table is made once per process (a class attribute): made again for each call here.
        monkeypatch.setattr(TorchFXPythonDecoder, "_decomp_table", None)
        with quieted(verbose=True, libraries=libraries):
            TorchFXPythonDecoder.from_exported_program(program)
        noted = [record for record in caplog.records if "not found in decomp table" in record.getMessage()]
        assert noted and noted[0].exc_info is not None  # what reached the terminal: a traceback each
        caplog.clear()
        monkeypatch.setattr(TorchFXPythonDecoder, "_decomp_table", None)
        with quieted(libraries=libraries):
            TorchFXPythonDecoder.from_exported_program(program)
        assert not [record for record in caplog.records if "decomp table" in record.getMessage()]
