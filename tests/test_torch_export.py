"""Kind ``torch_export``: one model description, exported once; what targets of the same
model share, what a target describing its model inline implies, and the program's bytes."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from edgebuild.core.manifest import load_manifest
from edgebuild.errors import ManifestError, ParameterError
from edgebuild.run.workspace import Workspace

from helpers import REPO, lay_out_project
from test_targets import CLIP


def test_targets_of_one_model_imply_one_export(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(CLIP)
    manifest = load_manifest(tmp_path / "artifacts.yaml")
    assert [name for name, params in manifest.artifacts.items() if params.kind == "torch_export"] == ["clip_et.torch_export"]
    assert {name: manifest.artifacts[name].source for name in ("clip_et", "clip_tflite", "clip_ov")} == \
        dict.fromkeys(("clip_et", "clip_tflite", "clip_ov"), "clip_et.torch_export")
    assert manifest.order(["clip_ov"]) == ["clip_et.torch_export", "clip_ov"]
    # Another shape is another model: another export.
    (tmp_path / "artifacts.yaml").write_text(CLIP.replace("  clip_ov:\n    <<: *clip\n",
                                                          "  clip_ov:\n    <<: *clip\n    dtype: fp16\n"))
    manifest = load_manifest(tmp_path / "artifacts.yaml")
    assert manifest.artifacts["clip_ov"].source == "clip_ov.torch_export"


@pytest.mark.parametrize("entry, message", [
    ("    kind: executorch\n", "artifacts -> bad: expected a source (a torch_export artifact), or the model: checkpoint "
                                 "and model_class"),
    ("    kind: litert\n    source: clip_onnx\n    checkpoint: clip\n    model_class: CLIPVisionModel\n",
     "artifacts -> bad: name a source or describe the model (checkpoint, model_class, ...), not both"),
    ("    kind: openvino\n    checkpoint: clip\n    model_class: CLIPVisionModel\n    inputs: {pixel_values: [1, 3, 64, 64]}\n"
     "    quantize: int8\n", "artifacts -> bad: quantize: int8 needs calibration inputs (images or tensors)"),
    ("    kind: executorch\n    checkpoint: clip\n    model_class: CLIPVisionModel\n"
     "    inputs: {pixel_values: {shape: [1, 3, 64, 64], dynamic: {0: [1, 4]}}}\n",
     "artifacts -> bad -> inputs -> pixel_values: dynamic: axis 0: expected 2 <= smallest <= largest, found [1, 4] "
     "(torch.export fixes an axis of size 1)"),
])
def test_bad_target_entries_are_one_line(tmp_path: Path, entry: str, message: str) -> None:
    (tmp_path / "artifacts.yaml").write_text(CLIP + "  bad:\n" + entry)
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    assert "\n" not in str(caught.value) and str(caught.value).endswith(message), str(caught.value)


def test_a_dynamic_axis_asked_of_a_target_that_has_none_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "artifacts.yaml").write_text(CLIP.replace("inputs: {pixel_values: [1, 3, 64, 64]}\n    outputs: [pooler_output, "
                                                          "last_hidden_state]\n    held_out",
                                                          "inputs: {pixel_values: {shape: [2, 3, 64, 64], dynamic: {0: [2, 4]}}}\n"
                                                          "    outputs: [pooler_output, last_hidden_state]\n    held_out", 1))
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    with pytest.raises(ParameterError) as caught:
        workspace.check(workspace.artifact("clip_tflite"))
    assert str(caught.value).endswith(
        "artifacts -> clip_tflite -> inputs: the litert target takes fixed shapes only, and 'clip_et.torch_export' "
        "declares dynamic axes; fix them, or export one model per shape")



@pytest.mark.slow
def test_the_program_is_the_same_bytes_in_any_checkout(tmp_path: Path) -> None:
    """Exported in two directories: byte for byte the same program.pt2 (no source paths, no
    random serialization id)."""
    manifest = CLIP.split("  clip_tflite:")[0]
    digests = []
    for where in ("one", "two"):
        project = lay_out_project(tmp_path / where / "project", manifest)
        built = project.doit("build", "clip_et.torch_export")
        assert built.returncode == 0, built.stdout + built.stderr
        digests.append(hashlib.sha256((project.root / "build" / "clip_et.torch_export" / "program.pt2").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = [
        "edgebuild/kinds/torch_export/params.py", "edgebuild/models/families.py", "edgebuild/models/family.py",
        "edgebuild/models/fields.py", "edgebuild/models/hf.py", "edgebuild/models/inputs.py",
        "edgebuild/models/qwen3_5/family.py", "edgebuild/models/qwen3_5/geometry.py",
        "edgebuild/models/qwen3_5/images.py", "edgebuild/models/qwen3_5/model.py", "edgebuild/targets/formats.py",
        "edgebuild/targets/program.py",
    ]
    assert_code_digests(
        "torch_export",
        build=[*common,
               "edgebuild/core/runner.py", "edgebuild/kinds/torch_export/build.py", "edgebuild/ml/images.py"],
        verify=[*common,
                "edgebuild/kinds/torch_export/verify.py", "edgebuild/models/held_out.py",
                "edgebuild/models/graph_inputs.py"],
    )
