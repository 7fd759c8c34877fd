"""The siglip_f143 kind: identical weights to the seed's algorithm in every mode,
a verifiable, reloadable, packable output, and clear errors for bad inputs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.core.checkpoint import Checkpoint
from edgebuild.errors import CheckpointError, ParameterError, VerificationFailed
from edgebuild.kinds.siglip_f143 import load_packed
from edgebuild.models.siglip.model import load_pixel_batches, load_vision_model
from edgebuild.core.manifest import load_manifest
from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace

import seed_pipeline
from helpers import lay_out_siglip_inputs


@pytest.fixture
def root(tmp_path: Path, siglip_checkpoint: Path) -> Path:
    lay_out_siglip_inputs(tmp_path, siglip_checkpoint)
    generator = torch.Generator().manual_seed(5)
    save_file({"pixel_values": torch.randn(2, 3, 64, 64, generator=generator)}, str(tmp_path / "pixels.safetensors"))
    return tmp_path


def manifest(root: Path, options: str = "", verify: str = "") -> BuildGraph:
    text = textwrap.dedent(
        """\
        checkpoints:
          siglip:
            path: ckpt
        artifacts:
          q:
            kind: siglip_f143
            checkpoint: siglip
            calibration:
              pixel_values: [pixels.safetensors]
              images: ["images/*.png"]
            held_out:
              images: ["held_out/*.png"]
        """
    )
    text += "".join(f"    {line}\n" for line in options.splitlines() if line.strip())
    if verify:
        text += "    verify:\n" + "".join(f"      {line}\n" for line in verify.splitlines() if line.strip())
    (root / "artifacts.yaml").write_text(text)
    return Workspace.open(root / "artifacts.yaml", root)


MODES = {
    "gptq": ("", seed_pipeline.SeedOptions()),
    "nearest": ("algorithm: nearest", seed_pipeline.SeedOptions(algorithm="nearest")),
    "sequential": ("sequential_layers: true", seed_pipeline.SeedOptions(sequential_layers=True)),
    "equalization": ("equalize_layernorm: true", seed_pipeline.SeedOptions(equalize_layernorm=True)),
    "equalization_sequential": (
        "equalize_layernorm: true\nsequential_layers: true\ndamp: 0.1",
        seed_pipeline.SeedOptions(equalize_layernorm=True, sequential_layers=True, damp=0.1),
    ),
    "no_bias_correction": ("bias_correction: false", seed_pipeline.SeedOptions(bias_correction=False)),
    "layer_subset": ("layers: 1", seed_pipeline.SeedOptions(layers=1)),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_weights_identical_to_the_seed_algorithm(root: Path, mode: str) -> None:
    options, seed_options = MODES[mode]
    project = manifest(root, options)
    logs: list[str] = []
    make_current(project, project.artifact("q"), log=logs.append)
    built = load_file(str(root / "build" / "q" / "model.safetensors"))

    checkpoint = Checkpoint(root / "ckpt")
    model, _ = load_vision_model(checkpoint, writable=True)
    params = project.manifest.artifacts["q"]
    batches = load_pixel_batches(params.calibration, root, checkpoint, "calibration")
    reference = seed_pipeline.run_seed(model, batches, seed_options)

    assert sorted(built) == sorted(reference.state)
    different = [name for name in built if not torch.equal(built[name], reference.state[name])]
    assert different == []
    quantized = [name for name in reference.objectives]
    assert len(quantized) == (6 if mode == "layer_subset" else 12)
    # The weights did change: this is not a comparison of two unquantized models.
    original = load_file(str(root / "ckpt" / "model.safetensors"))
    changed = [name for name in quantized if not torch.equal(built[f"{name}.weight"], original[f"vision_model.{name}.weight"])]
    assert changed == quantized
    report = json.loads((root / "build" / "q" / "quantization.json").read_text())
    assert report["forward_passes"] < reference.forward_passes
    for name, objective in reference.objectives.items():
        assert report["objectives"][name]["reconstructed"] == pytest.approx(objective["reconstructed"], rel=1e-5)
    if seed_options.equalize_layernorm:
        assert {name: item["alpha"] for name, item in report["equalization"].items()} == {
            name: item["alpha"] for name, item in reference.equalization.items()
        }


def test_linears_reading_one_tensor_share_their_hessians(siglip_checkpoint: Path) -> None:
    """q, k and v read layer_norm1's output: their Hessians are accumulated once and
    shared, and equal what each linear's own accumulation gives; out_proj and the MLP
    have their own."""
    from edgebuild.kinds.siglip_f143.calibration import Collector, encoder_linears
    from edgebuild.ml.quant.gptq import accumulate_block_hessians, empty_block_hessians
    from edgebuild.models.siglip.model import encoder_outputs

    model, config = load_vision_model(Checkpoint(siglip_checkpoint), writable=True)
    modules = encoder_linears(model, config.num_hidden_layers)
    inputs: dict[str, list[torch.Tensor]] = {name: [] for name in modules}
    own = [module.register_forward_pre_hook(lambda _m, args, name=name: inputs[name].append(args[0].clone()))
           for name, module in modules.items()]
    collector = Collector(16).hessians_of(modules)
    generator = torch.Generator().manual_seed(3)
    size = config.image_size
    encoder_outputs(model, [torch.randn(2, 3, size, size, generator=generator) for _ in range(2)])
    collector.close()
    for hook in own:
        hook.remove()
    for layer in range(config.num_hidden_layers):
        prefix = f"encoder.layers.{layer}."
        shared = collector.hessians[prefix + "self_attn.q_proj"]
        assert collector.hessians[prefix + "self_attn.k_proj"] is shared
        assert collector.hessians[prefix + "self_attn.v_proj"] is shared
        assert collector.hessians[prefix + "self_attn.out_proj"] is not shared
        assert collector.hessians[prefix + "mlp.fc1"] is not shared
    for name, module in modules.items():
        expected = empty_block_hessians(module.in_features, 16)
        for batch in inputs[name]:
            expected = accumulate_block_hessians(expected, batch)
        assert torch.equal(collector.hessians[name].hessians, expected.hessians), name
        assert torch.equal(collector.hessians[name].input_sum, expected.input_sum), name
        assert collector.hessians[name].count == expected.count


@pytest.mark.slow
def test_artifact_verifies_reloads_and_packs(root: Path) -> None:
    project = manifest(root, "equalize_layernorm: true")
    make_current(project, project.artifact("q"), log=lambda message: None)
    out = root / "build" / "q"
    assert sorted(path.name for path in out.iterdir() if not path.name.startswith(".")) == [
        "config.json", "consumer.json", "model.f143.safetensors", "model.safetensors", "preprocessor_config.json",
        "quantization.json",
    ]
    report = verify_artifact(project, project.artifact("q"), log=lambda message: None)
    checks = {check.name: check for check in report.checks}
    assert all(check.passed for check in report.checks)
    assert checks["off_grid_weights"].value == 0
    assert checks["packed_round_trip_mismatches"].value == 0
    assert checks["calibration.reload_reproduces_build"].passed
    assert 0.99 < checks["held_out.cosine"].value < 1.0
    # Codes plus tile exponents: about a quarter of float32.
    assert 0.25 < report.metrics["packed_ratio"] < 0.26

    saved = load_file(str(out / "model.safetensors"))
    unpacked = load_packed(out / "model.f143.safetensors")
    for name, tensor in saved.items():
        assert unpacked[name].dtype == tensor.dtype
        assert torch.equal(unpacked[name].view(torch.int32), tensor.view(torch.int32)) if tensor.dtype == torch.float32 else torch.equal(unpacked[name], tensor)

    from transformers import SiglipVisionModel

    model = SiglipVisionModel.from_pretrained(str(out), local_files_only=True)
    assert torch.equal(model.encoder.layers[0].mlp.fc1.weight, saved["encoder.layers.0.mlp.fc1.weight"])


@pytest.mark.slow
def test_unmeetable_threshold_fails_verification(root: Path) -> None:
    project = manifest(root, "algorithm: nearest", verify="cosine_min: 1.0")
    make_current(project, project.artifact("q"), log=lambda message: None)
    with pytest.raises(VerificationFailed, match=r"q: verification failed: calibration.cosine = 0\.99\d+ \(limit >= 1\): "):
        verify_artifact(project, project.artifact("q"), log=lambda message: None)
    report = json.loads((root / "build" / "q" / "report.json").read_text())
    assert report["passed"] is False


def test_no_calibration_is_a_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "artifacts.yaml"
    path.write_text("checkpoints:\n  s:\n    fixture: siglip_tiny\nartifacts:\n  q:\n    kind: siglip_f143\n    checkpoint: s\n    calibration: {}\n")
    with pytest.raises(Exception) as caught:
        load_manifest(path, environ={})
    assert str(caught.value) == f"{path}:5:3: artifacts -> q: calibration needs at least one pixel_values file or image"


def test_negative_damp_is_a_manifest_error(tmp_path: Path) -> None:
    path = tmp_path / "artifacts.yaml"
    path.write_text(
        "checkpoints:\n  s:\n    fixture: siglip_tiny\nartifacts:\n  q:\n    kind: siglip_f143\n    checkpoint: s\n"
        "    calibration: {images: [x.png]}\n    damp: -0.1\n"
    )
    with pytest.raises(Exception) as caught:
        load_manifest(path, environ={})
    assert str(caught.value) == f"{path}:9:5: artifacts -> q -> damp: input should be greater than or equal to 0; found -0.1"


def test_layer_count_out_of_range(root: Path) -> None:
    project = manifest(root, "layers: 3")
    with pytest.raises(ParameterError) as caught:
        project.record(project.artifact("q"))
    assert str(caught.value) == (
        f"{root / 'artifacts.yaml'}:13:5: artifacts -> q -> layers: 3 is outside the model "
        "(vision_config.num_hidden_layers = 2)"
    )
    assert not (root / "build").exists()


def test_checkpoint_without_vision_model(root: Path) -> None:
    state = load_file(str(root / "ckpt" / "model.safetensors"))
    save_file({name: value for name, value in state.items() if not name.startswith("vision_model.")}, str(root / "ckpt" / "model.safetensors"))
    project = manifest(root)
    with pytest.raises(CheckpointError) as caught:
        project.record(project.artifact("q"))
    assert str(caught.value) == (
        f"checkpoint 'siglip' ({root / 'ckpt'}): not a SigLIP vision encoder: expected a tensor named "
        "vision_model.embeddings.patch_embedding.weight or embeddings.patch_embedding.weight, found neither among "
        "24 tensors (in model.safetensors)"
    )


def test_calibration_glob_matching_nothing(root: Path) -> None:
    project = manifest(root)
    (root / "artifacts.yaml").write_text((root / "artifacts.yaml").read_text().replace("images/*.png", "imgs/*.png"))
    project = Workspace.open(root / "artifacts.yaml", root)
    with pytest.raises(CheckpointError) as caught:
        project.record(project.artifact("q"))
    assert str(caught.value) == (
        f"{root / 'artifacts.yaml'}:10:7: artifacts -> q -> calibration -> images: 'imgs/*.png' matches no file (relative to {root})"
    )


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = [
        "edgebuild/kinds/siglip_f143/packed.py", "edgebuild/kinds/siglip_f143/params.py",
        "edgebuild/ml/mapped_safetensors.py", "edgebuild/ml/quant/f143.py", "edgebuild/ml/quant/kernels.py",
        "edgebuild/models/hf.py", "edgebuild/models/siglip/f143.py", "edgebuild/models/siglip/model.py",
    ]
    assert_code_digests(
        "siglip_f143",
        build=[*common,
               "edgebuild/core/hashing.py", "edgebuild/core/inputs.py", "edgebuild/core/runner.py",
               "edgebuild/kinds/siglip_f143/build.py", "edgebuild/kinds/siglip_f143/calibration.py",
               "edgebuild/ml/compare.py", "edgebuild/ml/quant/gptq.py", "edgebuild/ml/images.py"],
        verify=[*common,
                "edgebuild/kinds/siglip_f143/verify.py"],
    )


def test_the_weights_loaded_as_views_are_exactly_the_linears_a_build_swaps(siglip_checkpoint: Path) -> None:
    """``is_linear_weight`` names the weights the build loads without copying: each must
    be one that calibration replaces (a view written into would cost a copy-on-write
    fault per page), and together they must be every encoder linear's."""
    from edgebuild.kinds.siglip_f143.calibration import encoder_linears, is_linear_weight

    model, config = load_vision_model(Checkpoint(siglip_checkpoint), writable=True, replaced=is_linear_weight)
    names = {name for name, _ in model.named_parameters() if is_linear_weight(name)}
    assert names == {f"{name}.weight" for name in encoder_linears(model, config.num_hidden_layers)}
    assert len(names) == 6 * config.num_hidden_layers
