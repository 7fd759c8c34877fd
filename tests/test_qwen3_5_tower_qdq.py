"""The qwen3_5_tower_qdq kind: calibration inputs through the checkpoint's image
processor's steps, the QNN QDQ recipe in bounded memory (same bytes as one quantize call),
verification against the float tower, the opset rule, and staleness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy
import pytest

from edgebuild.run.builder import make_current
from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.project import SourceNotBuilt
from edgebuild.errors import CheckpointError, ParameterError
from edgebuild.models.qwen3_5.images import images_to_patches, patch_preprocessing, read_preprocessor_config
from edgebuild.models.qwen3_5.inputs import tower_inputs
from edgebuild.models.qwen3_5.inputs import TowerInputs
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace

from helpers import REPO, pretend_built, verify_along

QUIET = {"log": lambda message: None}

MANIFEST = """\
checkpoints:
  qwen:
    path: ckpt
artifacts:
  t64:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
    opset: {opset}
  t64x128:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: [64, 128]
  q64:
    kind: qwen3_5_tower_qdq
    source: t64
    calibration:
      images: [images/*.png]
    held_out:
      images: [held_out/*.png]
  q64x128:
    kind: qwen3_5_tower_qdq
    source: t64x128
    calibration:
      images: [images/*.png]
      patches: [patches.safetensors]
    per_channel: true
"""


def lay_out(root: Path, checkpoint: Path, opset: int = 21) -> Path:
    """A copy of the Qwen fixture at ``root/ckpt``, the shipped images, the manifest."""
    shutil.copytree(checkpoint, root / "ckpt")
    shutil.copytree(REPO / "data" / "calibration", root / "images")
    shutil.copytree(REPO / "data" / "held_out", root / "held_out")
    (root / "artifacts.yaml").write_text(MANIFEST.format(opset=opset))
    return root


def geometry(height: int, width: int) -> dict:
    return {"height": height, "width": width, "grid_h": height // 16, "grid_w": width // 16,
            "patches": height * width // 256, "patch_dim": 1536}


# --- calibration inputs ------------------------------------------------------------


def test_fixture_ships_the_image_processor_of_its_tower(qwen_checkpoint: Path) -> None:
    config = json.loads((qwen_checkpoint / "preprocessor_config.json").read_text())
    vision = Checkpoint(qwen_checkpoint).config_section("vision_config")
    assert config["image_processor_type"] == "Qwen2VLImageProcessor"
    assert (config["patch_size"], config["temporal_patch_size"], config["merge_size"]) == (
        vision["patch_size"], vision["temporal_patch_size"], vision["spatial_merge_size"])


def test_an_image_of_another_size_is_resized_to_the_tower(tmp_path: Path, qwen_checkpoint: Path) -> None:
    from PIL import Image

    pixels = numpy.random.default_rng(0).integers(0, 256, (70, 100, 3), dtype=numpy.uint8)
    path = tmp_path / "wide.png"
    Image.fromarray(pixels).save(path)
    checkpoint = Checkpoint(qwen_checkpoint)
    (patches,) = images_to_patches(patch_preprocessing(checkpoint), [path], geometry(64, 128))
    assert patches.shape == (32, 1536) and patches.dtype == numpy.float32

    # Independently: bicubic resize to 128 x 64, pixels to [-1, 1] (mean = std = 0.5),
    # then Qwen2-VL's layout: patch rows in 2x2 merge blocks, each row (channel,
    # temporal copy, 16, 16).
    resized = numpy.asarray(Image.fromarray(pixels).resize((128, 64), resample=Image.BICUBIC), dtype=numpy.float64)
    normalised = (resized / 255.0 - 0.5) / 0.5

    def row(patch_y: int, patch_x: int) -> numpy.ndarray:
        block = normalised[patch_y * 16:(patch_y + 1) * 16, patch_x * 16:(patch_x + 1) * 16].transpose(2, 0, 1)
        return numpy.stack([block, block], axis=1).reshape(-1)

    # Rows 0-3 are the first 2x2 merge block; row 4 starts the next one to the right.
    for index, (patch_y, patch_x) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1), (0, 2)]):
        assert numpy.allclose(patches[index], row(patch_y, patch_x), atol=1e-5), index

    # transformers' processor, its own resize at a pixel budget of exactly 64 x 128,
    # leaves the resized image as it is: skipping that resize changes nothing.
    from transformers import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil.from_dict(read_preprocessor_config(checkpoint))
    with Image.open(path) as image:
        same = processor(images=[image.resize((128, 64), resample=processor.resample)], return_tensors="np",
                         size={"shortest_edge": 64 * 128, "longest_edge": 64 * 128})
    assert numpy.array_equal(same["pixel_values"], patches)
    assert same["image_grid_thw"].tolist() == [[1, 4, 8]]


def test_patches_files_in_either_layout(tmp_path: Path, qwen_checkpoint: Path) -> None:
    from safetensors.numpy import save_file

    values = numpy.arange(3 * 16 * 1536, dtype=numpy.float32).reshape(3, 16, 1536)
    save_file({"patches": values}, str(tmp_path / "stacked.safetensors"))
    save_file({"patches": values.reshape(48, 1536)}, str(tmp_path / "flat.safetensors"))
    checkpoint = Checkpoint(qwen_checkpoint)
    for name in ("stacked", "flat"):
        samples = tower_inputs(TowerInputs(patches=[f"{name}.safetensors"]), tmp_path, checkpoint, geometry(64, 64), "calibration")
        assert [sample.shape for sample in samples] == [(16, 1536)] * 3
        assert numpy.array_equal(numpy.stack(samples), values)

    save_file({"patches": values.reshape(24, 2, 1536)}, str(tmp_path / "odd.safetensors"))
    with pytest.raises(CheckpointError) as caught:
        tower_inputs(TowerInputs(patches=["odd.safetensors"]), tmp_path, checkpoint, geometry(64, 64), "calibration")
    assert str(caught.value) == (
        f"{tmp_path / 'odd.safetensors'}: tensor 'patches': expected shape [n * 16, 1536] or [n, 16, 1536] "
        "for this tower, found [24, 2, 1536]"
    )


def test_a_preprocessor_that_does_not_fit_the_tower_is_refused(tmp_path: Path, qwen_checkpoint: Path) -> None:
    root = lay_out(tmp_path, qwen_checkpoint)
    path = root / "ckpt" / "preprocessor_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(config | {"merge_size": 4}))
    with pytest.raises(CheckpointError) as caught:
        Workspace.open(root / "artifacts.yaml", root).artifact("q64").fingerprint
    assert str(caught.value) == (
        f"{path}: merge_size: expected 2 (vision_config.spatial_merge_size of config.json), found 4"
    )


# --- parameters and fingerprints -------------------------------------------------------


def test_sixteen_bit_types_need_a_source_at_opset_21(tmp_path: Path, qwen_checkpoint: Path) -> None:
    root = lay_out(tmp_path, qwen_checkpoint, opset=20)
    project = Workspace.open(root / "artifacts.yaml", root)
    with pytest.raises(ParameterError) as caught:
        project.fingerprint(project.artifact("q64"))
    assert str(caught.value) == (
        f"{root / 'artifacts.yaml'}:14:3: artifacts -> q64 -> activation_type: uint16 needs opset 21 "
        "(16-bit QuantizeLinear/DequantizeLinear in ai.onnx), but source 't64' is exported at opset 20; "
        "set its opset to 21, or use an 8-bit activation_type"
    )
    # 8-bit activations and weights are standard Q/DQ at any opset the tower takes.
    (root / "artifacts.yaml").write_text(MANIFEST.format(opset=20).replace(
        "    source: t64\n", "    source: t64\n    activation_type: uint8\n"))
    workspace = Workspace.open(root / "artifacts.yaml", root)
    workspace.check(workspace.artifact("q64"))


def test_staleness_follows_what_the_artifact_reads(tmp_path: Path, qwen_checkpoint: Path) -> None:
    from edgebuild.core.staleness import explain

    root = lay_out(tmp_path, qwen_checkpoint)
    manifest = root / "artifacts.yaml"

    def load() -> BuildGraph:
        return Workspace.open(manifest, root)

    before = load()
    # Made from the tower, the QDQ artifact is keyed by the tower's bytes: known once it is built.
    with pytest.raises(SourceNotBuilt):
        before.fingerprint(before.artifact("q64"))
    tower_bytes = pretend_built(before, "t64")
    # The tower's fingerprint covers the image processor's file (it carries it in its
    # consumer.json); the QDQ artifact reads it from the checkpoint behind its source.
    assert set(before.record(before.artifact("t64")).inputs["checkpoint"]["files"]) == {"preprocessor_config.json"}
    assert set(before.record(before.artifact("q64")).inputs["checkpoint"]["files"]) == {"preprocessor_config.json"}
    assert before.record(before.artifact("q64")).inputs["checkpoint"]["tensors"] == {}
    assert before.record(before.artifact("q64")).inputs["source"] == {"outputs": tower_bytes}
    assert before.record(before.artifact("q64")).versions["onnxruntime"] == before.record(before.artifact("t64")).versions["onnxruntime"]
    first = before.record(before.artifact("q64"))

    # An unrelated artifact changes: nothing here does.
    manifest.write_text(manifest.read_text().replace("image_size: [64, 128]", "image_size: [64, 96]"))
    unrelated = load()
    assert unrelated.fingerprint(unrelated.artifact("t64x128")) != before.fingerprint(before.artifact("t64x128"))
    assert unrelated.fingerprint(unrelated.artifact("q64")) == before.fingerprint(before.artifact("q64"))

    # Its source tower's parameters change: the QDQ artifact waits for the tower's new bytes...
    manifest.write_text(manifest.read_text().replace("    opset: 21\n", "    opset: 21\n    attn_implementation: eager\n"))
    source_changed = load()
    assert source_changed.fingerprint(source_changed.artifact("t64")) != before.fingerprint(before.artifact("t64"))
    with pytest.raises(SourceNotBuilt):
        source_changed.fingerprint(source_changed.artifact("q64"))
    # ... and when the tower is rebuilt to the same bytes, it is up to date (early cutoff) ...
    pretend_built(source_changed, "t64", tower_bytes)
    assert load().artifact("q64").fingerprint == first.fingerprint
    # ... while other bytes make it stale, naming the source file that changed.
    pretend_built(source_changed, "t64", {"model.onnx": "0" * 64})
    source_changed = load()
    assert source_changed.fingerprint(source_changed.artifact("q64")) != first.fingerprint
    reasons = explain(first.to_json(), source_changed.record(source_changed.artifact("q64")).to_json())
    assert reasons == ["source artifact t64: model.onnx changed"]

    # The image processor changes: both are stale (the QDQ artifact reads it; the tower
    # carries it), the QDQ one for its own reading of it even with the tower's bytes unchanged.
    previous = source_changed.record(source_changed.artifact("q64"))
    path = root / "ckpt" / "preprocessor_config.json"
    path.write_text(path.read_text().replace('"image_std": [\n    0.5', '"image_std": [\n    0.25'))
    processor_changed = load()
    assert processor_changed.fingerprint(processor_changed.artifact("t64")) != source_changed.fingerprint(source_changed.artifact("t64"))
    pretend_built(processor_changed, "t64", {"model.onnx": "0" * 64})
    processor_changed = load()
    assert processor_changed.fingerprint(processor_changed.artifact("q64")) != previous.fingerprint
    assert explain(previous.to_json(), processor_changed.record(processor_changed.artifact("q64")).to_json()) == [
        f"checkpoint 'qwen' ({root / 'ckpt'}): preprocessor_config.json changed"
    ]

    # A held-out image changes: re-verify, never rebuild.
    verify_before = processor_changed.verify_fingerprint(processor_changed.artifact("q64"))
    with open(root / "held_out" / "scene_100.png", "ab") as handle:
        handle.write(b"\0")
    held_out_changed = load()
    assert held_out_changed.fingerprint(held_out_changed.artifact("q64")) == processor_changed.fingerprint(processor_changed.artifact("q64"))
    assert held_out_changed.verify_fingerprint(held_out_changed.artifact("q64")) != verify_before


# --- building and verifying --------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, qwen_checkpoint: Path) -> Path:
    """Both QDQ artifacts of MANIFEST built and verified, once for the module."""
    from safetensors.numpy import save_file

    root = lay_out(tmp_path_factory.mktemp("qdq"), qwen_checkpoint)
    patches = numpy.random.default_rng(1).uniform(-1, 1, (2, 32, 1536)).astype(numpy.float32)
    save_file({"patches": patches}, str(root / "patches.safetensors"))
    project = Workspace.open(root / "artifacts.yaml", root)
    for name in ("t64", "t64x128", "q64", "q64x128"):
        make_current(project, project.artifact(name), **QUIET)
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("name", "patches", "inputs", "calibration"), [("q64", 16, "2 held_out", 4), ("q64x128", 32, "6 calibration", 6)])
def test_qdq_builds_and_verifies_at_two_sizes(built: Path, name: str, patches: int, inputs: str, calibration: int) -> None:
    project = Workspace.open(built / "artifacts.yaml", built)
    report = verify_along(project, name, **QUIET)
    assert report.passed, report.summary()
    checks = {check.name: check for check in report.checks}
    # Two blocks (qkv, proj, fc1, fc2, norm1, norm2 each), the merger (norm, fc1, fc2), the patch Conv.
    assert checks["quantized_weights"].value == 16
    assert checks["unquantized_weights"].value == 0
    assert checks["qdq_domains"].value == ["ai.onnx"]
    assert checks["opset"].value == 21
    assert checks["weight_types"].value == ["uint8"]
    assert checks["activation_types"].value == ["uint16"]
    assert 0.99 < checks["cosine"].value < 1.0
    assert 0 < checks["mean_abs"].value < 0.06
    assert report.metrics["comparison"]["reference"].endswith(f"{inputs} inputs")

    info = json.loads((built / "build" / name / "qdq.json").read_text())
    assert info["calibration_inputs"] == calibration
    assert info["geometry"]["patches"] == patches
    assert info["quantized_weights"]["by_op"] == {"Conv": 1, "Gemm": 10, "LayerNormalization": 5}
    assert info["quantized_biases"] == {"int32": 16}
    # The only float tensor a computing node reads: the graph's input, before its first Reshape.
    assert [(item["tensor"], item["consumer"]) for item in info["left_float"]] == [("patches", "Reshape")]
    text = (built / "build" / name / "qdq.json").read_text()
    assert str(built) not in text and "seconds" not in text


@pytest.mark.slow
def test_chunked_calibration_gives_the_bytes_of_one_quantize_call(built: Path) -> None:
    """The bounded-memory build is onnxruntime's recipe, byte for byte."""
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from edgebuild.ml.qdq import FeedsReader

    samples = tower_inputs(TowerInputs(images=["images/*.png"]), built, Checkpoint(built / "ckpt"), geometry(64, 64), "calibration")
    plain = built / "plain"
    shutil.copytree(built / "build" / "t64", plain)
    config = get_qnn_qdq_config(str(plain / "model.onnx"), FeedsReader([{"patches": sample} for sample in samples]),
                                activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8)
    quantize(str(plain / "model.onnx"), str(plain / "quantized.onnx"), config)
    assert (plain / "quantized.onnx.data").read_bytes() == (built / "build" / "q64" / "model.onnx.data").read_bytes()
    import onnx

    ours = onnx.load(str(built / "build" / "q64" / "model.onnx"), load_external_data=False)
    theirs = onnx.load(str(plain / "quantized.onnx"), load_external_data=False)
    # The graphs differ only in the external data file's name.
    for initializer in theirs.graph.initializer:
        for entry in initializer.external_data:
            if entry.key == "location":
                entry.value = "model.onnx.data"
    assert ours.SerializeToString() == theirs.SerializeToString()


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests, ONNX_CERTIFICATES

    common = [
        "edgebuild/kinds/qwen3_5_tower_qdq/params.py", "edgebuild/ml/onnx_tools.py", "edgebuild/ml/qdq.py",
        "edgebuild/ml/qdq_graph.py", "edgebuild/models/qwen3_5/geometry.py", "edgebuild/models/qwen3_5/images.py",
        "edgebuild/models/qwen3_5/inputs.py",
    ]
    assert_code_digests(
        "qwen3_5_tower_qdq",
        build=[*common,
               "edgebuild/core/inputs.py", "edgebuild/kinds/qwen3_5_tower_qdq/build.py",
               "edgebuild/ml/images.py", "edgebuild/targets/formats.py"],
        verify=[*common, *ONNX_CERTIFICATES,
                "edgebuild/kinds/qwen3_5_tower_qdq/verify.py", "edgebuild/ml/qdq_checks.py"],
    )
