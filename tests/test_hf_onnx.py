"""Kind ``hf_onnx``: any transformers class exported at fixed shapes with no code of its
own -- CLIP vision, DINOv2, wav2vec2 and SigLIP tiny checkpoints within 1e-4 of
transformers -- strictly loaded, its fingerprint covering what the class reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.errors import CheckpointError, ExportError, ManifestError, ParameterError
from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.run.workspace import Workspace

from helpers import REPO

QUIET = {"log": lambda message: None}
ENCODERS = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
  dino:
    fixture: dinov2_tiny
  w2v:
    fixture: wav2vec2_tiny
  siglip:
    fixture: siglip_vision_tiny
artifacts:
  clip_64:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output, last_hidden_state]
    held_out:
      images: [held_out/*.png]
  dino_64:
    kind: hf_onnx
    checkpoint: dino
    model_class: Dinov2Model
    inputs: {pixel_values: [2, 3, 64, 64]}
    outputs: [pooler_output]
  w2v_1600:
    kind: hf_onnx
    checkpoint: w2v
    model_class: Wav2Vec2Model
    inputs: {input_values: [1, 1600]}
  siglip_64:
    kind: hf_onnx
    checkpoint: siglip
    model_class: SiglipVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output]
"""


def _project(root: Path, manifest: str = ENCODERS) -> Workspace:
    shutil.copytree(REPO / "data" / "held_out", root / "held_out", dirs_exist_ok=True)
    (root / "artifacts.yaml").write_text(manifest)
    return Workspace.open(root / "artifacts.yaml", root)


def _error(tmp_path: Path, entry: str) -> str:
    (tmp_path / "artifacts.yaml").write_text(
        "checkpoints:\n  clip:\n    fixture: clip_vision_tiny\nartifacts:\n  a:\n    kind: hf_onnx\n    checkpoint: clip\n" + entry)
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    return str(caught.value).split(": artifacts -> a", 1)[1]


def test_parameters_are_checked_in_the_manifest(tmp_path: Path) -> None:
    base = "    model_class: CLIPVisionModel\n"
    assert _error(tmp_path, "    model_class: clip vision\n    inputs: {pixel_values: [1, 3, 64, 64]}\n") == (
        " -> model_class: expected a transformers class name such as 'CLIPVisionModel'; found 'clip vision'")
    assert _error(tmp_path, base + "    inputs: {pixel-values: [1, 3, 64, 64]}\n") == (
        " -> inputs: input name 'pixel-values' is not a forward() argument name")
    assert _error(tmp_path, base + "    inputs: {pixel_values: [1, 3, 65536, 65536]}\n") == (
        " -> inputs -> pixel_values -> shape: 12884901888 elements; at most 268435456 (2**28) per input")
    assert _error(tmp_path, base + "    inputs: {pixel_values: [0, 3]}\n") == (
        " -> inputs -> pixel_values -> shape -> 0: input should be greater than 0; found 0")
    assert _error(tmp_path, base + "    inputs: {input_values: [1, 1600]}\n    held_out:\n      images: [x.png]\n") == (
        ": held_out images go into a 'pixel_values' input of shape [batch, channels, height, width]")
    assert _error(tmp_path, base + "    inputs: {pixel_values: [1, 3, 64, 64]}\n    outputs: [a, a]\n") == (
        " -> outputs: each output at most once")


def test_the_fingerprint_covers_every_tensor_or_only_the_prefixes(tmp_path: Path) -> None:
    workspace = _project(tmp_path)
    record = workspace.record(workspace.artifact("clip_64"))
    tensors = record.inputs["checkpoint"]["tensors"]
    checkpoint = workspace.checkpoint("clip")
    assert sorted(tensors) == sorted(checkpoint.tensors)
    assert set(record.inputs["checkpoint"]["files"]) == {"preprocessor_config.json"}
    assert record.inputs["checkpoint"]["config_key"] is None
    narrowed = _project(tmp_path, ENCODERS.replace("    outputs: [pooler_output, last_hidden_state]\n",
                                                    "    outputs: [pooler_output]\n    tensor_prefixes: [encoder.]\n"))
    assert sorted(narrowed.record(narrowed.artifact("clip_64")).inputs["checkpoint"]["tensors"]) == sorted(
        name for name in checkpoint.tensors if name.startswith("encoder."))


def test_a_class_transformers_lacks_is_a_parameter_error(tmp_path: Path) -> None:
    workspace = _project(tmp_path, ENCODERS.replace("model_class: CLIPVisionModel", "model_class: CLIPVisonModel"))
    with pytest.raises(ParameterError) as caught:
        workspace.fingerprint(workspace.artifact("clip_64"))
    assert str(caught.value) == (
        f"{tmp_path / 'artifacts.yaml'}:14:5: artifacts -> clip_64 -> model_class: 'CLIPVisonModel' is not a class "
        "transformers provides (did you mean 'CLIPVisionModel'?)"
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """Every encoder of ENCODERS built and verified, once for the module."""
    workspace = _project(tmp_path_factory.mktemp("encoders"))
    for artifact in workspace.order():
        make_current(workspace, artifact, **QUIET)
    return workspace


@pytest.mark.slow
@pytest.mark.parametrize(("name", "outputs"), [("clip_64", ["pooler_output", "last_hidden_state"]),
                                               ("dino_64", ["pooler_output"]), ("w2v_1600", ["last_hidden_state"]),
                                               ("siglip_64", ["pooler_output"])])
def test_encoders_export_within_1e4_of_transformers(built: Workspace, name: str, outputs: list[str]) -> None:
    report = verify_artifact(built, built.artifact(name), **QUIET)
    assert report.passed, report.summary()
    checks = {check.name: check for check in report.checks}
    for output in outputs:
        # Judged relative to the output's scale by default; the absolute error is measured all the same.
        assert checks[f"{output}.max_rel"].value <= 1e-4 and checks[f"{output}.max_rel"].limit == 1e-4
        assert f"{output}.max_abs" not in checks and report.metrics["outputs"][output]["max_abs"] <= 1e-4
        assert checks[f"{output}.cosine"].value >= 0.9999
    assert checks["allowzero_reshapes"].value == 0
    info = json.loads((built.artifact(name).directory / "export.json").read_text())
    assert [output["name"] for output in info["outputs"]] == outputs
    assert info["opset"] == 21 and info["model_class"] == built.artifact(name).params.model_class


@pytest.mark.slow
def test_held_out_images_go_through_the_checkpoints_processor(built: Workspace) -> None:
    report = verify_artifact(built, built.artifact("clip_64"), **QUIET)
    assert report.metrics["inputs"] == "2 random inputs and 2 batches of held-out images"


@pytest.mark.slow
def test_an_output_the_model_lacks_and_tensors_outside_the_prefixes_are_refused(tmp_path: Path) -> None:
    workspace = _project(tmp_path, ENCODERS.replace("outputs: [pooler_output, last_hidden_state]", "outputs: [logits]"))
    with pytest.raises(ExportError) as caught:
        make_current(workspace, workspace.artifact("clip_64"), **QUIET)
    assert str(caught.value) == "outputs: CLIPVisionModel returns no 'logits'; it returns last_hidden_state, pooler_output"
    workspace = _project(tmp_path, ENCODERS.replace("outputs: [pooler_output, last_hidden_state]",
                                                    "outputs: [pooler_output]\n    tensor_prefixes: [encoder.]"))
    with pytest.raises(ExportError) as caught:
        make_current(workspace, workspace.artifact("clip_64"), **QUIET)
    assert "CLIPVisionModel reads embeddings." in str(caught.value)
    assert str(caught.value).endswith("outside tensor_prefixes ['encoder.']: add its prefix, or the fingerprint would not cover it")
    assert not workspace.artifact("clip_64").directory.exists()


@pytest.mark.slow
def test_a_checkpoint_missing_a_tensor_is_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from edgebuild.core.fixtures import write_fixture

    checkpoint = write_fixture(tmp_path / "clip", "clip_vision_tiny")
    weights = load_file(str(checkpoint / "model.safetensors"))
    del weights["post_layernorm.bias"]
    save_file(weights, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    workspace = _project(tmp_path, ENCODERS.replace("    fixture: clip_vision_tiny", f"    path: {checkpoint}"))
    with pytest.raises(CheckpointError) as caught:
        make_current(workspace, workspace.artifact("clip_64"), **QUIET)
    assert str(caught.value) == f"checkpoint 'clip' ({checkpoint}): lacks tensors the class needs of CLIPVisionModel: post_layernorm.bias"


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests, ONNX_CERTIFICATES

    common = [
        "edgebuild/kinds/hf_onnx/params.py", "edgebuild/ml/onnx_tools.py", "edgebuild/models/hf.py",
        "edgebuild/models/inputs.py",
    ]
    assert_code_digests(
        "hf_onnx",
        build=[*common,
               "edgebuild/core/runner.py", "edgebuild/kinds/hf_onnx/build.py", "edgebuild/ml/images.py",
               "edgebuild/targets/formats.py"],
        verify=[*common, *ONNX_CERTIFICATES,
                "edgebuild/kinds/hf_onnx/verify.py", "edgebuild/models/held_out.py", "edgebuild/models/graph_inputs.py"],
    )


DYNAMIC_BATCH = """\
checkpoints:
  clip:
    fixture: clip_vision_tiny
artifacts:
  clip_dyn:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs:
      pixel_values: {shape: [2, 3, 64, 64], dynamic: {0: [2, 8]}}
    outputs: [pooler_output]
"""


@pytest.mark.slow
def test_a_dynamic_batch_is_exported_symbolic_and_verified_at_both_ends(tmp_path: Path) -> None:
    """A batch axis declared dynamic: the graph's input has a symbolic batch, verification
    runs at the smallest and the largest batch, and a size between them, run by hand in
    onnxruntime, agrees with transformers."""
    import numpy
    import onnx
    import onnxruntime
    import torch
    import transformers

    workspace = _project(tmp_path, DYNAMIC_BATCH)
    make_current(workspace, workspace.artifact("clip_dyn"), **QUIET)
    report = verify_artifact(workspace, workspace.artifact("clip_dyn"), **QUIET)
    assert report.passed, report.summary()
    assert report.metrics["inputs"] == "4 random inputs at the smallest and at the largest dynamic sizes"
    directory = workspace.artifact("clip_dyn").directory
    graph = onnx.load(str(directory / "model.onnx"), load_external_data=False).graph
    batch = graph.input[0].type.tensor_type.shape.dim[0]
    assert not batch.HasField("dim_value") and batch.dim_param
    assert json.loads((directory / "export.json").read_text())["inputs"][0]["dynamic"] == {"0": [2, 8]}
    pixels = torch.randn(5, 3, 64, 64, generator=torch.Generator().manual_seed(5))
    (produced,) = onnxruntime.InferenceSession(str(directory / "model.onnx")).run(None, {"pixel_values": pixels.numpy()})
    model = transformers.CLIPVisionModel.from_pretrained(workspace.checkpoint("clip").directory).eval()
    with torch.no_grad():
        expected = model(pixel_values=pixels).pooler_output.numpy()
    assert produced.shape == (5, expected.shape[1]) and numpy.abs(produced - expected).max() <= 1e-4
    # Fixed shapes are written as before: an artifact without `dynamic:` keeps its fingerprint.
    fixed = workspace.artifact("clip_dyn").params.model_copy(
        update={"inputs": {"pixel_values": workspace.artifact("clip_dyn").params.inputs["pixel_values"].model_copy(
            update={"dynamic": {}})}})
    assert fixed.build_parameters()["inputs"] == {"pixel_values": {"shape": [2, 3, 64, 64], "dtype": None}}


WARM_UP_THEN_FORK = r'''
import os
import sys
import tempfile
from pathlib import Path

import torch
from transformers import CLIPVisionConfig, CLIPVisionModel

from edgebuild.ml.onnx_tools import EXPORT_WARMUPS, export_onnx
from edgebuild.run.forkserver import _import_quietly


def exported_in_a_fork(directory: Path) -> bytes:
    """The tiny CLIP encoder exported in a forked child, as a build worker forked from the
    fork server exports it; the graph's and its weights' bytes."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            torch.manual_seed(0)
            config = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      image_size=64, patch_size=16)
            directory.mkdir()
            export_onnx(CLIPVisionModel(config).eval(), (torch.zeros(1, 3, 64, 64),), directory / "model.onnx",
                        ["pixel_values"], ["pooler_output", "last_hidden_state"], 18)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the export forked into {directory} failed"
    return b"".join(path.name.encode() + path.read_bytes() for path in sorted(directory.iterdir()))


root = Path(sys.argv[1])
torch.set_num_threads(2)
cold = exported_in_a_fork(root / "cold")
state, threads = torch.get_rng_state(), torch.get_num_threads()
# What the warm-up creates on disk: a server killed during it must leave nothing behind.
# (tempfile finds its directory once per process by creating and removing a probe file:
# done here first, so that it is not counted.)
tempfile.gettempdir()
created, watching = [], True


def watch(event, args):
    if not watching or isinstance(args[0], (str, bytes)) and os.path.exists(args[0]):
        return  # (torch makes sure its own cache directory is there, at every export)
    if event in ("os.mkdir", "tempfile.mkdtemp", "tempfile.mkstemp"):
        created.append((event, args[0]))
    elif event == "open" and (isinstance(args[1], str) and set(args[1]) & set("wax+")
                              or isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
        created.append((event, args[0]))


sys.addaudithook(watch)
_import_quietly(EXPORT_WARMUPS)  # as the fork server imports it, after forking a build
watching = False
assert "edgebuild.ml.exporter_warmup" in sys.modules, "the warm-up failed"
assert not created, f"the warm-up wrote to disk: {created}"
assert torch.equal(torch.get_rng_state(), state) and torch.get_num_threads() == threads
print("same bytes" if exported_in_a_fork(root / "warm") == cold else "other bytes")
'''


@pytest.mark.slow
def test_an_export_after_the_exporter_warmed_up_writes_the_same_bytes(tmp_path: Path) -> None:
    """The exporting kinds warm torch's exporter up in the fork server after it forks a
    build (``build_warmups``), so later builds skip the first export's extra seconds: a
    build forked after the warm-up writes the bytes a cold one does, the server's random
    generator and thread count are as they were, the fork does not hang (OpenMP), and the
    warm-up creates no file or directory (a server killed during it leaves nothing behind)."""
    import os
    import subprocess
    import sys

    from edgebuild.kinds.hf_onnx import HfOnnx
    from edgebuild.kinds.qwen3_5_tower import Qwen3_5VisionTower
    from edgebuild.kinds.siglip_f143_onnx import SiglipF143Onnx
    from edgebuild.ml.onnx_tools import EXPORT_WARMUPS
    from edgebuild.run.workers import worker_warmups

    for kind in (HfOnnx, Qwen3_5VisionTower, SiglipF143Onnx):
        assert kind.process.build_warmups == EXPORT_WARMUPS
        assert worker_warmups(kind, "build") == worker_warmups(kind, "export") == EXPORT_WARMUPS
        assert worker_warmups(kind, "verify") == ()
    done = subprocess.run([sys.executable, "-c", WARM_UP_THEN_FORK, str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "same bytes", done.stdout + done.stderr[-3000:]
