"""The example target plugin keeps edgebuild's kind contract (``edgebuild.testing``), and its
own coverage target is gated as a built-in one is: by the manifest, with nothing in
edgebuild naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgebuild.testing import TinyProject, check_code_digests, check_kind_contract

CLIP = """\
checkpoints:
  clip: {fixture: clip_vision_tiny}
artifacts:
  clip:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
  fp16:
    kind: onnx_float16
    source: clip
"""


def test_its_certificate_comes_from_the_format_it_writes_and_is_in_its_verification_digest() -> None:
    from edgebuild.core.registry import get_kind

    kind = get_kind("onnx_float16")
    # The ONNX graph's targets (it writes one) and its own.
    assert list(kind.certificates()) == ["nnapi", "coreml", "directml", "float16"]
    build, verify = check_code_digests("onnx_float16")
    assert "edgebuild_onnx_float16/coverage.py" in verify
    assert "edgebuild_onnx_float16/verify.py" not in build


def test_a_gate_on_a_target_it_has_not_is_a_manifest_error(tmp_path: Path) -> None:
    from edgebuild.core.manifest import load_manifest
    from edgebuild.errors import ManifestError

    (tmp_path / "artifacts.yaml").write_text(CLIP + "    verify: {coverage: {flaot16: {min_fraction: 0.9}}}\n")
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    assert str(caught.value).endswith(
        "artifacts -> fp16 -> verify -> coverage: unknown coverage target 'flaot16' (did you mean 'float16'?); this "
        "artifact's kind can be certified for nnapi, coreml, directml, float16")


def _float32_share(model_path: Path) -> tuple[int, int]:
    """(nodes counted, nodes in float32), computed here from the graph's own types."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    types = {value.name: value.type.tensor_type.elem_type for value in (*graph.input, *graph.output, *graph.value_info)}
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    counted = float32 = 0
    for node in graph.node:
        floats = {types.get(name) for name in (*node.input, *node.output)} & {1, 10}
        if node.op_type != "Cast" and floats:
            counted += 1
            float32 += 1 in floats
    return counted, float32


@pytest.mark.slow
def test_its_gate_passes_and_fails_by_what_the_converter_kept_in_float32(tmp_path: Path) -> None:
    project = TinyProject(tmp_path)
    gated = "    verify: {coverage: {float16: {min_fraction: 1.0, never_on_cpu: [LayerNormalization]}}}\n"
    project.manifest(CLIP + gated)
    passed = project.doit("verify")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    report = json.loads((tmp_path / "build" / "fp16" / "report.json").read_text())
    found = report["coverage"]["float16"]
    counted, float32 = _float32_share(tmp_path / "build" / "fp16" / "model.onnx")
    assert (found["nodes_total"], found["nodes_taken"], found["partitions"]) == (counted, counted - float32, 1)
    assert counted > 50 and float32 == 0
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["coverage.float16.fraction"]["passed"] and checks["pooler_output.cosine"]["value"] > 0.999
    assert checks["vs_float.pooler_output.cosine"]["passed"]
    # The layer norms kept in float32: the same gate fails, naming them.
    project.manifest(CLIP + "    op_block_list: [LayerNormalization]\n" + gated)
    failed = project.doit("verify")
    assert failed.returncode == 1
    report = json.loads((tmp_path / "build" / "fp16" / "report.json").read_text())
    checks = {check["name"]: check for check in report["checks"]}
    counted, float32 = _float32_share(tmp_path / "build" / "fp16" / "model.onnx")
    assert float32 > 0 and checks["coverage.float16.fraction"]["value"] == round((counted - float32) / counted, 6)
    assert not checks["coverage.float16.never_on_cpu"]["passed"]
    assert "LayerNormalization" in checks["coverage.float16.never_on_cpu"]["detail"]


@pytest.mark.slow
def test_the_plugin_keeps_the_contract(tmp_path: Path) -> None:
    check_kind_contract("onnx_float16", tmp_path)
