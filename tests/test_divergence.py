"""Where an artifact leaves float (issue 61, the first part): ``doit divergence`` compares
each member of a chain with transformers' forward module by module, names the step and
module where an error is made, and keeps what it computed like a build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from edgebuild.run.divergence import ONSET_REL_L2, made_error

from helpers import CLIP_TO_QDQ, REPO, lay_out_project


def _rows(errors: dict[str, float]) -> list[dict]:
    return [{"module": module, "vs_previous_rel_l2": error, "rel_l2": error} for module, error in errors.items()]


# A clean 8-bit QDQ step of a 6-block tiny CLIP, as measured (rounded): a few percent
# everywhere, the branches (self_attn, mlp) above the residual stream.
CLEAN = {"embeddings.patch_embedding": 0.009, "embeddings": 0.055, "pre_layrnorm": 0.038}
for block, (attention, mlp, stream) in enumerate([(0.05, 0.038, 0.046), (0.158, 0.155, 0.12), (0.175, 0.15, 0.132),
                                                 (0.11, 0.109, 0.13), (0.108, 0.109, 0.118), (0.139, 0.102, 0.12)]):
    CLEAN |= {f"encoder.layers.{block}.layer_norm1": stream, f"encoder.layers.{block}.self_attn": attention,
              f"encoder.layers.{block}.layer_norm2": stream, f"encoder.layers.{block}.mlp": mlp,
              f"encoder.layers.{block}": stream}
CLEAN |= {"encoder": 0.12, "post_layernorm": 0.116}


def test_the_onset_rule_names_a_module_that_stands_out_and_nothing_in_a_clean_profile() -> None:
    assert made_error(_rows(CLEAN)) is None
    # One block's MLP with outlier channels: 0.40 where its peers lose 0.10 to 0.16.
    assert made_error(_rows(CLEAN | {"encoder.layers.3.mlp": 0.40}))["module"] == "encoder.layers.3.mlp"
    # The same jump below a fifth of the values is not an error that matters.
    assert made_error(_rows(CLEAN | {"encoder.layers.3.mlp": ONSET_REL_L2 * 0.9})) is None
    # A module no block repeats stands out against everything before it.
    assert made_error(_rows({"embeddings": 0.01, "pre_layrnorm": 0.3}))["module"] == "pre_layrnorm"
    # Half the values lost at the first module and passed on: the first module made it.
    assert made_error(_rows({module: 0.5 for module in CLEAN}))["module"] == "embeddings.patch_embedding"
    # The outputs row is the artifact's outputs, not a module: never an onset.
    assert made_error(_rows({"embeddings": 0.01, "(outputs) pooler_output": 0.9})) is None


def _doit(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([str(Path(sys.executable).with_name("doit")), *args], cwd=root, capture_output=True,
                          text=True, timeout=600, env=os.environ | {"EDGEBUILD_REMOTE_CACHE": "off"})


def test_divergence_takes_one_built_artifact_and_a_depth(tmp_path: Path) -> None:
    lay_out_project(tmp_path, CLIP_TO_QDQ)
    for args, said in [(("clip", "qdq"), "doit divergence takes one artifact, 2 given; `doit list` shows them"),
                       (("qdq", "--depth", "0"), "--depth 0: expected 1 to 16"),
                       (("qdq",), "qdq: clip is not built at its current fingerprint; `doit build qdq` first")]:
        result = _doit(tmp_path, "divergence", *args)
        assert (result.returncode, result.stdout, result.stderr) == (2, "", f"edgebuild: error: {said}\n"), args


@pytest.mark.slow
def test_a_clean_chain_names_no_onset_and_a_second_run_computes_nothing(tmp_path: Path) -> None:
    lay_out_project(tmp_path, CLIP_TO_QDQ)
    built = _doit(tmp_path, "build")
    assert built.returncode == 0, built.stdout + built.stderr
    first = _doit(tmp_path, "divergence", "qdq", "--json")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["cached"] is False and result["onset"] is None
    assert result["inputs"] == "2 held_out inputs"
    export, quantization = result["hops"]
    assert (export["from"], export["to"], export["step"]) == ("float", "clip", "export")
    assert (quantization["from"], quantization["to"], quantization["step"]) == ("clip", "qdq", "quantization")
    modules = [row["module"] for row in export["modules"]]
    # Every block and its direct children, in the order they end, then the outputs.
    assert modules[:3] == ["embeddings.patch_embedding", "embeddings", "pre_layrnorm"]
    assert {"encoder.layers.0.self_attn", "encoder.layers.0.mlp", "encoder.layers.1", "post_layernorm"} <= set(modules)
    assert modules.index("encoder.layers.0.mlp") < modules.index("encoder.layers.0") < modules.index("encoder.layers.1")
    assert modules[-1] == "(outputs) pooler_output" and not any("fc1" in module for module in modules)
    # The export keeps transformers' values at every module; the QDQ step loses a few percent.
    assert max(row["rel_l2"] for row in export["modules"]) < 1e-5
    assert all(0.9 < row["cosine"] <= 1.0 + 1e-9 for row in quantization["modules"])
    assert 1e-3 < max(row["vs_previous_rel_l2"] for row in quantization["modules"]) < ONSET_REL_L2
    # vs_previous is measured against the previous member: for the export hop, float itself.
    assert all(row["vs_previous_rel_l2"] == row["rel_l2"] for row in export["modules"])
    on_disk = json.loads((tmp_path / "build" / "qdq" / "divergence.json").read_text())
    assert on_disk == result

    again = _doit(tmp_path, "divergence", "qdq", "--json")
    assert again.returncode == 0 and json.loads(again.stdout) == result | {"cached": True}
    assert "divergence: running" not in again.stderr


    # Beside the build, never part of it: not stored, and a rebuild's directory goes without it.
    assert _doit(tmp_path, "verify").returncode == 0
    from edgebuild.cache.store import Store
    from edgebuild.run.workspace import Workspace

    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    assert "divergence.json" not in Store(tmp_path / "cache" / "store").files(workspace.artifact("qdq").fingerprint)
    text = _doit(tmp_path, "divergence", "qdq")
    assert text.stdout.startswith("qdq: divergence from float on 2 held_out inputs (depth 3, cached)\n  onset: none"), \
        text.stdout


@pytest.mark.slow
def test_a_tower_exported_through_a_wrapper_and_converted_to_ort_is_compared_as_each_shows_it(tmp_path: Path) -> None:
    """The tower's graph names its modules under the export wrapper (``tower.blocks.0``) and
    its exporter moves each block's residual add into another module: the rows are the
    model's paths, and a block whose graph tensor is not its own is left out, not called an
    error of the export."""
    from helpers import TOWER_MANIFEST

    lay_out_project(tmp_path, TOWER_MANIFEST + "  ort:\n    kind: ort_format\n    source: t\n")
    assert _doit(tmp_path, "build").returncode == 0
    result = json.loads(_doit(tmp_path, "divergence", "ort", "--depth", "2", "--json").stdout)
    assert result["onset"] is None
    export, conversion = result["hops"]
    # An ORT file shows no module's tensors: compared at its outputs, the modules it hides said.
    assert (conversion["from"], conversion["to"], conversion["step"]) == ("t", "ort", "conversion")
    assert [row["module"] for row in conversion["modules"]] == ["(outputs) embeds"]
    assert conversion["hidden"]["why"].endswith("shows no module's tensors: compared at its outputs only")
    assert "blocks.1.attn" in conversion["hidden"]["modules"]
    modules = [row["module"] for row in export["modules"]]
    assert {"patch_embed", "blocks.0.attn", "blocks.1.mlp", "merger", "(outputs) embeds"} <= set(modules), modules
    assert max(row["rel_l2"] for row in export["modules"]) < 1e-5
    assert set(export["hidden"]["untrue"]) <= {"blocks.0", "blocks.1"} and not set(export["hidden"]["untrue"]) & set(modules)


def _with_outlier_channels(checkpoint: Path, block: int, scale: float = 60.0) -> None:
    """Two channels of one block's MLP made outliers: fc1's rows and bias times ``scale``,
    fc2's columns over it. The float model stays a working model; its activations there
    span 60 times the rest, which per-tensor 8-bit quantization cannot hold."""
    from safetensors.numpy import load_file, save_file

    path = checkpoint / "model.safetensors"
    state = load_file(path)
    prefix = next(key for key in state if key.endswith(f"layers.{block}.mlp.fc1.weight")).removesuffix("fc1.weight")
    channels = [3, 17]
    fc1, bias, fc2 = (state[prefix + name].copy() for name in ("fc1.weight", "fc1.bias", "fc2.weight"))
    fc1[channels] *= scale
    bias[channels] *= scale
    fc2[:, channels] /= scale
    state |= {prefix + "fc1.weight": fc1, prefix + "fc1.bias": bias, prefix + "fc2.weight": fc2}
    save_file(state, path, metadata={"format": "pt"})


@pytest.mark.slow
def test_a_block_with_outlier_channels_is_named_with_the_step_and_its_nodes(tmp_path: Path) -> None:
    from edgebuild.core.fixtures import write_fixture

    write_fixture(tmp_path / "ckpt", "clip_vision_tiny", {"num_hidden_layers": 4}, seed=5)
    _with_outlier_channels(tmp_path / "ckpt", block=2)
    manifest = CLIP_TO_QDQ.replace("  clip:\n    fixture: clip_vision_tiny\n", "  clip:\n    path: ckpt\n", 1)
    # A gate against float it cannot meet: the failure says how to find where it leaves float.
    lay_out_project(tmp_path, manifest + "    verify:\n      vs_float: {cosine_min: 0.99999}\n")
    verified = _doit(tmp_path, "verify")
    said = verified.stdout + verified.stderr
    assert verified.returncode != 0 and "qdq: verification failed: vs_float.pooler_output.cosine = " in said, said
    assert "(`doit divergence qdq` says at which module and step it leaves float)" in said, said
    result = _doit(tmp_path, "divergence", "qdq", "--json")
    assert result.returncode == 0, result.stderr
    onset = json.loads(result.stdout)["onset"]
    assert onset["module"] == "encoder.layers.2.mlp", onset
    assert onset["hop"] == {"from": "clip", "to": "qdq", "step": "quantization"}
    assert onset["vs_previous_rel_l2"] >= ONSET_REL_L2 and onset["nodes_total"] >= len(onset["nodes"]) > 0
    import onnx

    graph = onnx.load(str(tmp_path / "build" / "qdq" / "model.onnx"), load_external_data=False).graph
    assert set(onset["nodes"]) <= {node.name for node in graph.node}
    # The nodes that compute come first, the quantizer's Q/DQ after them.
    assert "MatMul" in onset["nodes"][0] or "linear" in onset["nodes"][0], onset["nodes"]
    # The lines say it as the JSON does.
    text = _doit(tmp_path, "divergence", "qdq").stdout
    assert "  onset: encoder.layers.2.mlp, made by clip -> qdq (quantization): its own error there " in text, text


@pytest.mark.parametrize("shape", [(4,), (2, 3)])
def test_errors_of_a_tensor_against_its_reference(shape: tuple[int, ...]) -> None:
    from edgebuild.run.divergence import _errors

    reference = numpy.arange(1, 1 + numpy.prod(shape), dtype=numpy.float32).reshape(shape)
    assert _errors(reference, reference) == (pytest.approx(1.0), 0.0, 0.0)
    cosine, relative, worst = _errors(reference * 1.1, reference)
    assert cosine == pytest.approx(1.0) and relative == pytest.approx(0.1, rel=1e-5)
    assert worst == pytest.approx(0.1 * reference.max(), rel=1e-5)
    assert _errors(numpy.zeros(shape), numpy.zeros(shape)) == (1.0, 0.0, 0.0)
