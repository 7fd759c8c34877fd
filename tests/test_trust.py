"""What "up to date" and "verified" promise: every file a build or verification reads is
in the fingerprint, the fingerprint depends on content and not on names or locations,
the payload is a function of the fingerprint alone, and a tampered output is noticed."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.errors import ExportError
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace
from edgebuild.core.record import read_record

from helpers import pretend_built, REPO, ProjectDir, signing_env, flip_bits

EVERY_KIND = """\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
  siglip:
    path: ckpt
artifacts:
  tower:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
  quantized:
    kind: siglip_f143
    checkpoint: siglip
    calibration:
      images: ["images/*.png"]
    held_out:
      images: ["held_out/*.png"]
    algorithm: nearest
    sorted_metadata: true
  graph:
    kind: siglip_f143_onnx
    source: quantized
"""


def lay_out(root: Path, siglip_checkpoint: Path, manifest: str = EVERY_KIND) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(siglip_checkpoint, root / "ckpt")
    shutil.copytree(REPO / "data" / "calibration", root / "images")
    shutil.copytree(REPO / "data" / "held_out", root / "held_out")
    (root / "artifacts.yaml").write_text(manifest)
    return root


def build_and_verify(root: Path) -> BuildGraph:
    project = Workspace.open(root / "artifacts.yaml", root)
    for name in project.manifest.order():
        make_current(project, project.artifact(name), log=lambda message: None)
        verify_artifact(project, project.artifact(name), log=lambda message: None)
    return project


# --- every file read is fingerprinted --------------------------------------------------

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


def _covered_checkpoints(project: BuildGraph, name: str) -> list[tuple[object, dict]]:
    """(checkpoint, what ``name``'s own fingerprint holds of it) for every checkpoint its
    build and verification may read: its own, and those behind its sources. An artifact
    made from a source is keyed by the source's bytes, so what it reads of the checkpoint
    behind it must be in its own fingerprint, not only in the source's."""
    record = project.artifact(name).record
    nothing = {"tensors": {}, "files": {}}
    return [(checkpoint, record.inputs.get("checkpoint", nothing))
            for checkpoint in project.checkpoints_for(project.manifest.artifacts[name]).values()]


def _covered_files(project: BuildGraph, name: str) -> set[Path]:
    """Input files in ``name``'s fingerprints: its own (build and verification) and its
    sources' (in its verification fingerprint)."""
    artifacts = [project.artifact(name), *project.artifact(name).sources]
    files = set()
    for artifact in artifacts:
        for verify_only in (False, True):
            _, named = project._input_files(artifact, verify_only)
            files |= {(project.manifest.root / path).resolve() for paths in named.values() for path in paths}
    return files


@pytest.mark.slow
def test_every_file_read_by_build_and_verify_is_in_the_fingerprint(tmp_path: Path, siglip_checkpoint: Path) -> None:
    """Through an audit hook on every ``open`` of this process, and the checkpoints' own
    record of the tensors and files they handed out (SafeTensors are mapped in Rust,
    where no audit hook sees them)."""
    global _OPENED
    root = lay_out(tmp_path / "project", siglip_checkpoint)
    project = Workspace.open(root / "artifacts.yaml", root)
    for name in project.manifest.order():
        # Fingerprinted first (its sources are built by now): what hashing opens is covered.
        project.artifact(name).record
        project.artifact(name).verify_fingerprint
        _OPENED = []
        try:
            make_current(project, project.artifact(name), log=lambda message: None)
            verify_artifact(project, project.artifact(name), log=lambda message: None)
            opened = {Path(path).resolve() for path in _OPENED}
        finally:
            _OPENED = None
        checkpoints = _covered_checkpoints(project, name)
        for checkpoint, fingerprint in checkpoints:
            assert checkpoint.tensors_read <= set(fingerprint["tensors"]), name
            assert checkpoint.files_read <= set(fingerprint.get("files", {})), name
            assert "config" in fingerprint
        inputs = _covered_files(project, name)
        uncovered = []
        for path in opened:
            in_checkpoint = next((c for c, _ in checkpoints if path.is_relative_to(c.directory.resolve())), None)
            if in_checkpoint is not None:
                relative = path.relative_to(in_checkpoint.directory.resolve()).as_posix()
                if relative != "config.json" and not relative.endswith(".safetensors") and relative not in dict(checkpoints)[in_checkpoint].get("files", {}):
                    uncovered.append(path)
            elif path.is_relative_to(root.resolve()) and not path.is_relative_to((root / "build").resolve()) \
                    and not path.is_relative_to((root / "cache").resolve()) and path not in inputs:
                uncovered.append(path)
        assert uncovered == [], f"{name} read files its fingerprint does not cover"


@pytest.mark.slow
def test_a_changed_image_processor_makes_the_siglip_artifact_stale(tmp_path: Path, siglip_checkpoint: Path) -> None:
    root = lay_out(tmp_path, siglip_checkpoint)
    project = Workspace.open(root / "artifacts.yaml", root)
    quantized_bytes = pretend_built(project, "quantized")
    before = {name: project.artifact(name).fingerprint for name in ("tower", "quantized", "graph")}
    preprocessor = root / "ckpt" / "preprocessor_config.json"
    settings = json.loads(preprocessor.read_text())
    settings["image_mean"] = [0.4, 0.4, 0.4]
    preprocessor.write_text(json.dumps(settings))
    after = Workspace.open(root / "artifacts.yaml", root)
    assert before["quantized"] != after.fingerprint(after.artifact("quantized"))
    assert before["tower"] == after.fingerprint(after.artifact("tower"))
    # Even if the quantized encoder came out byte for byte the same, the graph is stale: its
    # verification runs held-out images through the processor itself.
    pretend_built(after, "quantized", quantized_bytes)
    assert Workspace.open(root / "artifacts.yaml", root).artifact("graph").fingerprint != before["graph"]


def test_siglip_checkpoint_without_image_processor_fails_before_building(tmp_path: Path, siglip_checkpoint: Path) -> None:
    root = lay_out(tmp_path, siglip_checkpoint)
    (root / "ckpt" / "preprocessor_config.json").unlink()
    project = ProjectDir(root)
    result = project.doit("build", "quantized")
    assert result.returncode != 0
    assert (
        f"{root / 'ckpt' / 'preprocessor_config.json'}: is missing (checkpoint 'siglip' ({root / 'ckpt'}) must provide it)"
    ) in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (root / "build" / "quantized").exists()


# --- the same content is the same artifact, wherever and however it is named ---------

RENAMED = (
    EVERY_KIND.replace("  qwen:\n", "  qwen_renamed:\n").replace("checkpoint: qwen\n", "checkpoint: qwen_renamed\n")
    .replace("  siglip:\n    path: ckpt", "  encoder:\n    path: ./ckpt/")
    .replace("checkpoint: siglip\n", "checkpoint: encoder\n")
    .replace('images: ["images/*.png"]', 'images: ["./images/*.png"]')
    .replace("  quantized:\n", "  renamed_quantized:\n").replace("source: quantized", "source: renamed_quantized")
)


@pytest.mark.slow
@pytest.mark.workflow
def test_two_checkouts_build_identical_bytes_and_share_through_the_remote(tmp_path: Path, siglip_checkpoint: Path,
                                                                          keys: dict[str, Path]) -> None:
    """Two checkouts at different paths, the second with other aliases, a trailing
    slash, `./` in a glob, and its held-out glob absolute: the same fingerprints; the
    first builds every kind, the second pulls all of it and exports nothing; every
    payload file is byte-identical to a third, independent build."""
    first = lay_out(tmp_path / "a" / "first", siglip_checkpoint)
    second = lay_out(tmp_path / "elsewhere" / "second", siglip_checkpoint)
    (second / "artifacts.yaml").write_text(
        RENAMED.replace('images: ["held_out/*.png"]', f'images: ["{second}/held_out/*.png"]')
    )
    remote = tmp_path / "remote"
    remote.mkdir()
    # A team's runners: each signs what it pushes with the team's key and trusts it.
    shared = signing_env(keys, str(remote))
    os.environ.update(shared)
    try:
        built = build_and_verify(first)
        other = Workspace.open(second / "artifacts.yaml", second)
        pairs = {"tower": "tower", "quantized": "renamed_quantized", "graph": "graph"}
        assert {name: built.artifact(name).fingerprint for name in pairs} == {
            name: other.artifact(renamed).fingerprint for name, renamed in pairs.items()
        }
        messages: list[str] = []
        for name in other.manifest.order():
            make_current(other, other.artifact(name), log=messages.append)
        assert all(message.startswith("pulled from the remote cache") for message in messages), messages
    finally:
        for variable in shared:
            del os.environ[variable]
    third = build_and_verify(lay_out(tmp_path / "third", siglip_checkpoint))
    for name in ("tower", "quantized", "graph"):
        record = read_record(first / "build" / name)
        assert record is not None
        for output in record.outputs:
            assert (first / "build" / name / output).read_bytes() == (third.layout.artifact_dir(name) / output).read_bytes(), (name, output)


SYMLINKED = """\
checkpoints:
  qwen:
    path: qwen
  siglip:
    path: ckpt
artifacts:
  tower:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 64
  quantized:
    kind: siglip_f143
    checkpoint: siglip
    calibration:
      images: ["images/*.png"]
    algorithm: nearest
"""


def test_symlinked_checkpoint_and_input_directories_are_the_same_artifact(
    tmp_path: Path, siglip_checkpoint: Path, qwen_checkpoint: Path
) -> None:
    """One project holds its checkpoints and images; another reaches the same files
    through directory links: the same fingerprints, and `doit status` names a change in
    words, through the link the manifest uses."""
    real = lay_out(tmp_path / "real", siglip_checkpoint, SYMLINKED)
    shutil.copytree(qwen_checkpoint, real / "qwen")
    (tmp_path / "linked").mkdir()
    linked = ProjectDir(tmp_path / "linked")
    for name in ("qwen", "ckpt", "images"):
        (linked.root / name).symlink_to(real / name, target_is_directory=True)
    linked.manifest(SYMLINKED)
    first = Workspace.open(real / "artifacts.yaml", real)
    second = Workspace.open(linked.root / "artifacts.yaml", linked.root)
    for name in ("tower", "quantized"):
        assert second.artifact(name).fingerprint == first.artifact(name).fingerprint, name
        assert second.artifact(name).record.inputs == first.artifact(name).record.inputs, name
    assert second.record(second.artifact("quantized")).inputs_named["files:calibration.images"][0].startswith("images/")

    # As if built in the linked project; then an image and the image processor change
    # in the real directories.
    for name in ("tower", "quantized"):
        directory = second.layout.artifact_dir(name)
        directory.mkdir(parents=True)
        second.artifact(name).record.completed(name, {}, 0.0, {}).write(directory)
    image = sorted((real / "images").glob("*.png"))[0]
    image.write_bytes(image.read_bytes() + b"\0")
    preprocessor = real / "ckpt" / "preprocessor_config.json"
    preprocessor.write_text(preprocessor.read_text().replace("0.5", "0.25", 1))
    result = linked.doit("status")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "tower      up to date (not verified)",
        "quantized  stale",
        f"             - checkpoint 'siglip' ({linked.root / 'ckpt'}): preprocessor_config.json changed",
        f"             - calibration.images: images/{image.name} changed",
    ]


# --- parameters the toolchain cannot honour ------------------------------------------------

@pytest.mark.slow
def test_exporter_writing_another_opset_is_refused(tmp_path: Path) -> None:
    import torch

    from edgebuild.ml import onnx_tools

    module = torch.nn.Linear(4, 2).eval()
    with pytest.raises(ExportError, match="asked torch's exporter for opset 99, it wrote opset 18; refusing the graph"):
        onnx_tools.export_onnx(module, (torch.ones(1, 4),), tmp_path / "m.onnx", ["x"], ["y"], 99)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("opset: 99", "input should be less than or equal to 28; found 99"),
        ("opset: 100000000000000000000000", "input should be less than or equal to 28; found 100000000000000000000000"),
        ("image_size: 100000000000000000000000000000000",
         "image sizes must be at most 8192; found 100000000000000000000000000000000"),
    ],
)
def test_out_of_range_parameters_are_manifest_errors(tmp_path: Path, line: str, expected: str) -> None:
    from edgebuild.errors import ManifestError
    from edgebuild.core.manifest import load_manifest

    key = line.split(":")[0]
    base = {"opset": "opset: 21", "image_size": "image_size: 64"}
    text = textwrap.dedent(f"""\
        checkpoints:
          qwen:
            fixture: qwen3_5_vl_tiny
        artifacts:
          t:
            kind: qwen3_5_vision_tower
            checkpoint: qwen
            {base['image_size'] if key != 'image_size' else line}
            {base['opset'] if key != 'opset' else line}
        """)
    (tmp_path / "artifacts.yaml").write_text(text)
    with pytest.raises(ManifestError) as caught:
        load_manifest(tmp_path / "artifacts.yaml")
    line_number = 8 if key == "image_size" else 9
    assert str(caught.value) == f"{tmp_path / 'artifacts.yaml'}:{line_number}:5: artifacts -> t -> {key}: {expected}"


# --- a tampered output ----------------------------------------------------------------------

@pytest.mark.slow
def test_output_edited_in_place_at_the_same_size_is_restored_by_build(verified_seed: Path, tmp_path: Path) -> None:
    from helpers import clone_project

    project = clone_project(verified_seed, tmp_path / "p")
    data = project.root / "build" / "t" / "model.onnx.data"
    original = data.read_bytes()
    flip_bits(data, 100)
    result = project.doit("build", env={"EDGEBUILD_REMOTE_CACHE": "off"})
    assert result.returncode == 0, result.stderr
    assert "[t] build/t: model.onnx.data changed or missing since the build; replacing it" in result.stderr
    assert data.read_bytes() == original
