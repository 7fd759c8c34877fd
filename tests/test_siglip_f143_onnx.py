"""The siglip_f143_onnx kind: FP8 initializers with blocked DequantizeLinear that decode
bit-exactly, a graph onnxruntime runs, and artifact-to-artifact staleness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy
import pytest
import torch

from edgebuild.errors import SourceNotVerified

from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.ml.quant.f143 import quantize_nearest
from edgebuild.kinds.siglip_f143_onnx.build import rewrite_fp8
from edgebuild.ml.onnx_tools import blocked_fp8_weights, export_onnx, run_session
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace

from helpers import pretend_built, lay_out_siglip_inputs

class OneLinear(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fp8_rewrite_of_one_linear_decodes_bit_exactly(tmp_path: Path, dtype: str) -> None:
    import onnx

    generator = torch.Generator().manual_seed(0)
    # 100 x 150: neither side a multiple of 64, tiles of very different scales.
    weight = torch.randn(100, 150, generator=generator) * torch.logspace(-3, 1, 150)
    weight = quantize_nearest(weight)
    torch_dtype = getattr(torch, dtype)
    example = torch.randn(7, 150, generator=generator)
    float_path = tmp_path / "float" / "model.onnx"
    float_path.parent.mkdir()
    export_onnx(OneLinear(weight).to(torch_dtype).eval(), (example.to(torch_dtype),), float_path, ["x"], ["y"], 21)
    fp8_path = tmp_path / "fp8" / "model.onnx"
    shutil.copytree(float_path.parent, fp8_path.parent)

    rewritten = rewrite_fp8(fp8_path, {"linear.weight": weight}, ["linear.weight"], 64, dtype)
    meta = rewritten["linear.weight"]
    model = onnx.load(str(fp8_path))
    initializers = {item.name: item for item in model.graph.initializer}
    assert initializers[meta["initializer"] + "_f143"].data_type == onnx.TensorProto.FLOAT8E4M3FNUZ
    assert meta["initializer"] not in initializers
    (node,) = [node for node in model.graph.node if node.op_type == "DequantizeLinear"]
    assert {attribute.name: attribute.i for attribute in node.attribute} == {"axis": meta["axis"], "block_size": 64}
    decoded = blocked_fp8_weights(model)[meta["initializer"]]["decoded"]
    decoded = decoded.T if meta["axis"] == 0 else decoded
    assert numpy.array_equal(decoded.view(numpy.uint32), weight.numpy().view(numpy.uint32))

    # onnxruntime dequantizes exactly: the FP8 graph computes what the float graph computes.
    feed = [{"x": example.numpy().astype(numpy.float16 if dtype == "float16" else numpy.float32)}]
    (float_out,), (fp8_out,) = run_session(float_path, feed)[0], run_session(fp8_path, feed)[0]
    assert numpy.array_equal(float_out, fp8_out)
    size = lambda path: path.stat().st_size + path.with_name("model.onnx.data").stat().st_size  # noqa: E731
    assert size(fp8_path) < 0.3 * size(float_path) * (2 if dtype == "float16" else 1)


MANIFEST = """\
checkpoints:
  siglip:
    path: ckpt
artifacts:
  q:
    kind: siglip_f143
    checkpoint: siglip
    calibration:
      images: ["images/*.png"]
    held_out:
      images: ["held_out/*.png"]
    damp: {damp}
  q_onnx:
    kind: siglip_f143_onnx
    source: q
    opset: {opset}
"""


@pytest.fixture
def root(tmp_path: Path, siglip_checkpoint: Path) -> Path:
    lay_out_siglip_inputs(tmp_path, siglip_checkpoint)
    (tmp_path / "artifacts.yaml").write_text(MANIFEST.format(damp=0.01, opset=21))
    return tmp_path


@pytest.mark.slow
def test_onnx_artifact_builds_and_verifies(root: Path) -> None:
    project = Workspace.open(root / "artifacts.yaml", root)
    make_current(project, project.artifact("q"), log=lambda message: None)
    make_current(project, project.artifact("q_onnx"), log=lambda message: None)
    # Judged only once its source passed (the chain rule).
    with pytest.raises(SourceNotVerified, match="^q_onnx: not judged: its source q is not verified at its current "):
        verify_artifact(project, project.artifact("q_onnx"), log=lambda message: None)
    verify_artifact(project, project.artifact("q"), log=lambda message: None)
    report = verify_artifact(project, project.artifact("q_onnx"), log=lambda message: None)
    checks = {check.name: check for check in report.checks}
    assert all(check.passed for check in report.checks), report.summary()
    assert checks["fp8_weights"].value == 12
    assert 0.25 < checks["quantized_weight_ratio"].value < 0.28
    assert 0 < checks["vs_quantized_torch.max_rel"].value <= 1e-4
    # The quantization error, against the float encoder at the root of the chain (the
    # checkpoint's SiglipVisionModel), on the source's held-out images.
    assert 0.99 < checks["vs_float.last_hidden_state.cosine"].value < 1.0
    assert checks["vs_float.last_hidden_state.cosine"].limit == 0.99
    assert report.metrics["inputs"] == "2 held_out images of q"
    assert report.metrics["vs_float"]["inputs"] == "2 held_out images of q"
    assert report.metrics["vs_float"]["root"] == "q"
    assert report.metrics["graph_bytes"] < report.metrics["float_graph_bytes"]


def test_changing_the_source_or_only_the_opset(root: Path) -> None:
    before = Workspace.open(root / "artifacts.yaml", root)
    pretend_built(before, "q")
    first = before.fingerprint(before.artifact("q_onnx"))
    (root / "artifacts.yaml").write_text(MANIFEST.format(damp=0.02, opset=21))
    damp = Workspace.open(root / "artifacts.yaml", root)
    assert damp.fingerprint(damp.artifact("q")) != before.fingerprint(before.artifact("q"))
    # Keyed by its source's bytes: the source's new build writes other bytes.
    pretend_built(damp, "q")
    assert damp.fingerprint(damp.artifact("q_onnx")) != first
    (root / "artifacts.yaml").write_text(MANIFEST.format(damp=0.01, opset=22))
    opset = Workspace.open(root / "artifacts.yaml", root)
    assert opset.fingerprint(opset.artifact("q")) == before.fingerprint(before.artifact("q"))
    pretend_built(opset, "q")
    assert opset.fingerprint(opset.artifact("q_onnx")) != first


@pytest.mark.slow
def test_building_the_onnx_artifact_builds_its_source_first(project_dir, siglip_checkpoint: Path) -> None:
    lay_out_siglip_inputs(project_dir.root, siglip_checkpoint)
    project_dir.manifest(MANIFEST.format(damp=0.01, opset=21))
    result = project_dir.doit("build", "q_onnx")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.index(".  q\n") < result.stdout.index(".  q_onnx\n")
    info = json.loads((project_dir.root / "build" / "q_onnx" / "export.json").read_text())
    assert len(info["rewritten"]) == 12


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests, ONNX_CERTIFICATES

    common = [
        "edgebuild/kinds/siglip_f143_onnx/model.py", "edgebuild/kinds/siglip_f143_onnx/params.py",
        "edgebuild/ml/onnx_tools.py", "edgebuild/models/hf.py", "edgebuild/models/siglip/f143.py",
        "edgebuild/models/siglip/model.py",
    ]
    assert_code_digests(
        "siglip_f143_onnx",
        build=[*common,
               "edgebuild/core/hashing.py", "edgebuild/core/inputs.py", "edgebuild/core/runner.py",
               "edgebuild/kinds/siglip_f143_onnx/build.py", "edgebuild/ml/quant/f143.py",
               "edgebuild/ml/quant/kernels.py", "edgebuild/ml/images.py"],
        verify=[*common, *ONNX_CERTIFICATES,
                "edgebuild/kinds/siglip_f143_onnx/verify.py"],
    )
