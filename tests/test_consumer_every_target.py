"""``consumer.json`` is enough for an application on every target: a test application that
reads nothing of edgebuild but that file feeds each built artifact of a tiny image model
and of the tiny DistilBERT classifier in its own runtime (ExecuTorch, LiteRT's
interpreter, OpenVINO, onnxruntime on an ONNX graph and on the ORT format, torch on the
program), by the declared names, dtypes and shapes, through the shipped tokenizer or the
carried image processor, and reads the declared outputs and labels; the documented
snippets do the same. The contract's new parts come from the fingerprint only: the
tokenizer a text model's fingerprint covers, ``id2label`` where all of ``config.json`` is
covered."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy
import pytest

from edgebuild.run.workspace import Workspace

from helpers import CLIP_TO_QDQ, REPO, lay_out_project, made_once

SENTENCES = ["the cat was fast", "a big red house"]
# What the tiny DistilBERT's config.json names its classes.
LABELS = {"0": "negative", "1": "positive"}
TOKENIZER = {"directory": "tokenizer", "files": ["tokenizer.json", "tokenizer_config.json"]}

# A text model without held-out texts (its tokenizer is in the fingerprint all the same:
# it is a text model), an image model with held-out images (its image processor is), each
# to every target, lowered from one program or converted from one ONNX graph.
EVERY_TARGET = """\
checkpoints:
  bert: {fixture: distilbert_tiny}
  clip: {fixture: clip_vision_tiny}
artifacts:
  text_program:
    kind: torch_export
    checkpoint: bert
    model_class: DistilBertForSequenceClassification
    inputs: {input_ids: [2, 16], attention_mask: [2, 16]}
    outputs: [logits]
  text_pte: {kind: executorch, source: text_program}
  text_tflite: {kind: litert, source: text_program}
  text_ir: {kind: openvino, source: text_program}
  text_onnx:
    kind: hf_onnx
    checkpoint: bert
    model_class: DistilBertForSequenceClassification
    inputs: {input_ids: [2, 16], attention_mask: [2, 16]}
    outputs: [logits]
  text_ort: {kind: ort_format, source: text_onnx}
  image_program:
    kind: torch_export
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output, last_hidden_state]
    held_out: {images: [held_out/*.png]}
  image_pte: {kind: executorch, source: image_program}
  image_tflite: {kind: litert, source: image_program}
  image_ir: {kind: openvino, source: image_program}
  image_onnx:
    kind: hf_onnx
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}
    outputs: [pooler_output, last_hidden_state]
    held_out: {images: [held_out/*.png]}
  image_ort: {kind: ort_format, source: image_onnx}
"""
TEXTS = ("text_program", "text_pte", "text_tflite", "text_ir", "text_onnx", "text_ort")
IMAGES = ("image_program", "image_pte", "image_tflite", "image_ir", "image_onnx", "image_ort")


# --- without a build: what the contract takes from the fingerprint -----------------------------


def _contract_of(root: Path, name: str, sources: dict[str, Path] | None = None,
                 scratch_name: str = "") -> dict[str, Any]:
    """The contract ``name``'s build would write, into a scratch directory of its own."""
    workspace = Workspace.open(root / "artifacts.yaml", root)
    artifact = workspace.artifact(name)
    inputs = workspace.kind_inputs(artifact)
    scratch = root / "scratch" / (scratch_name or name)
    scratch.mkdir(parents=True)
    artifact.kind.write_consumer_contract(scratch, artifact.params, inputs["checkpoints"],
                                          inputs["sources"] if sources is None else sources)
    return json.loads((scratch / "consumer.json").read_text())


def test_a_text_model_ships_the_tokenizer_and_labels_its_fingerprint_covers(tmp_path: Path) -> None:
    lay_out_project(tmp_path, EVERY_TARGET)
    contract = _contract_of(tmp_path, "text_onnx")
    # No graph in an empty scratch directory: the tokenizer and the labels alone.
    assert contract == {"format": 1, "tokenizer": TOKENIZER, "labels": {"id2label": LABELS}}
    (checkpoint,) = (tmp_path / "cache" / "fixtures").glob("distilbert_tiny-*")
    shipped = tmp_path / "scratch" / "text_onnx" / "tokenizer"
    assert sorted(path.name for path in shipped.iterdir()) == TOKENIZER["files"]
    for name in TOKENIZER["files"]:
        assert (shipped / name).read_bytes() == (checkpoint / name).read_bytes()
    # What it ships is in its fingerprint, held-out texts or not: an edited vocabulary rebuilds it.
    before = Workspace.open(tmp_path / "artifacts.yaml", tmp_path).artifact("text_onnx").fingerprint
    tokenizer = json.loads((checkpoint / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["zebra"] = len(tokenizer["model"]["vocab"])
    (checkpoint / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert Workspace.open(tmp_path / "artifacts.yaml", tmp_path).artifact("text_onnx").fingerprint != before


def test_an_image_model_carries_its_processor_and_neither_tokenizer_nor_labels(tmp_path: Path) -> None:
    lay_out_project(tmp_path, EVERY_TARGET)
    contract = _contract_of(tmp_path, "image_onnx")
    assert sorted(contract) == ["format", "image_processor"]
    assert contract["image_processor"]["config"]["image_processor_type"] == "CLIPImageProcessor"
    assert not (tmp_path / "scratch" / "image_onnx" / "tokenizer").exists()


def test_a_sources_tokenizer_and_labels_are_carried_and_only_a_tokenizers_files_copied(tmp_path: Path) -> None:
    """An artifact made from a source (a QDQ graph of an ONNX graph) carries the source's
    labels and tokenizer, its files copied from the source's directory -- only files a
    tokenizer is saved as: a contract naming another path ships no tokenizer."""
    lay_out_project(tmp_path, CLIP_TO_QDQ)
    source = tmp_path / "source"
    (source / "tokenizer").mkdir(parents=True)
    (source / "tokenizer" / "vocab.txt").write_text("[PAD]\nthe\n")
    inherited: dict[str, Any] = {"format": 1, "labels": {"id2label": {"0": "cat"}},
                                 "tokenizer": {"directory": "tokenizer", "files": ["vocab.txt"]}}
    (source / "consumer.json").write_text(json.dumps(inherited))
    contract = _contract_of(tmp_path, "qdq", sources={"clip": source})
    assert contract["labels"] == inherited["labels"] and contract["tokenizer"] == inherited["tokenizer"]
    assert (tmp_path / "scratch" / "qdq" / "tokenizer" / "vocab.txt").read_text() == "[PAD]\nthe\n"
    inherited["tokenizer"]["files"] = ["../consumer.json"]
    (source / "consumer.json").write_text(json.dumps(inherited))
    contract = _contract_of(tmp_path, "qdq", sources={"clip": source}, scratch_name="outside")
    assert "tokenizer" not in contract and contract["labels"] == inherited["labels"]
    assert not (tmp_path / "scratch" / "outside" / "tokenizer").exists()


# --- built: a test application on every target -------------------------------------------------


@pytest.fixture(scope="module")
def every_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both models to every target, built once for the module (the contract is written at
    build time; nothing here needs a verification)."""
    def make(root: Path) -> None:
        project = lay_out_project(root, EVERY_TARGET)
        built = project.doit("build")
        assert built.returncode == 0, built.stdout + built.stderr

    return made_once(tmp_path_factory, "consumer_every_target", make)


def _described(contract: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The one program of an artifact, ONNX graph or another runtime's: (file, description)."""
    ((file, program),) = (contract.get("graphs", {}) | contract.get("programs", {})).items()
    return file, program


def _fits(shape: tuple[int, ...], declared: list[Any]) -> bool:
    return len(shape) == len(declared) and all(dim is None or dim == size for size, dim in zip(shape, declared))


def application_feed(directory: Path, contract: dict[str, Any], program: dict[str, Any]) -> dict[str, numpy.ndarray]:
    """What an application makes of two sentences or two images for ``program``'s inputs,
    from the contract alone: the shipped tokenizer, or the carried image processor."""
    batch = program["inputs"][0]["shape"][0]
    if "tokenizer" in contract:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory / contract["tokenizer"]["directory"])
        length = program["inputs"][0]["shape"][1]
        # Padded to the fixed length: the mask holds zeros, so ids and mask are not interchangeable.
        made = dict(tokenizer(SENTENCES[:batch], padding="max_length", max_length=length, truncation=True,
                              return_tensors="np"))
    else:
        import transformers
        from PIL import Image

        settings = dict(contract["image_processor"]["config"])
        settings.pop("processor_class", None)
        processor = getattr(transformers, settings.pop("image_processor_type"))(**settings)
        paths = sorted((REPO / "data" / "held_out").glob("*.png"))[:batch]
        images = [Image.open(path).convert("RGB") for path in paths]
        made = {"pixel_values": processor(images=images, return_tensors="np")["pixel_values"]}
    feed = {}
    for spec in program["inputs"]:
        value = made[spec["name"]]
        assert _fits(value.shape, spec["shape"]), (spec, value.shape)
        feed[spec["name"]] = value.astype(spec["dtype"])
    return feed


def application_run(directory: Path, file: str, program: dict[str, Any],
                    feed: dict[str, numpy.ndarray]) -> dict[str, numpy.ndarray]:
    """The artifact's file in its own runtime, fed and read by the declared names and order."""
    path = str(directory / file)
    arrays = [feed[spec["name"]] for spec in program["inputs"]]
    names = [spec["name"] for spec in program["outputs"]]
    suffix = Path(file).suffix
    if suffix in (".onnx", ".ort"):
        import onnxruntime

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        return dict(zip(names, session.run(names, feed)))
    if suffix == ".pte":
        import torch
        from executorch.runtime import Runtime

        method = Runtime.get().load_program(path).load_method("forward")
        produced = method.execute([torch.from_numpy(array) for array in arrays])
        return {name: value.numpy() for name, value in zip(names, produced)}
    if suffix == ".tflite":
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=path)
        interpreter.allocate_tensors()
        details = interpreter.get_input_details() + interpreter.get_output_details()
        index = {item["name"]: item["index"] for item in details}
        for spec, array in zip(program["inputs"], arrays):
            interpreter.set_tensor(index[spec["tensor"]], array)
        interpreter.invoke()
        return {spec["name"]: interpreter.get_tensor(index[spec["tensor"]]).copy() for spec in program["outputs"]}
    if suffix == ".xml":
        import openvino

        compiled = openvino.Core().compile_model(path, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        result = compiled(feed)
        return {name: result[name] for name in names}
    assert suffix == ".pt2", file
    import torch

    with torch.no_grad():
        produced = torch.export.load(path).module()(*(torch.from_numpy(array) for array in arrays))
    produced = produced if isinstance(produced, (tuple, list)) else (produced,)
    return {name: value.numpy() for name, value in zip(names, produced)}


@pytest.mark.slow
@pytest.mark.parametrize("names", [TEXTS, IMAGES], ids=["text", "image"])
def test_an_application_feeds_every_target_from_its_contract_alone(every_target: Path, names: tuple[str, ...]) -> None:
    """Each artifact's outputs, read by the declared names, have the declared dtypes and
    shapes, and agree across targets (inputs given in another order would not); a text
    model's classes are named by the carried labels."""
    found = {}
    for name in names:
        directory = every_target / "build" / name
        contract = json.loads((directory / "consumer.json").read_text())
        assert ("tokenizer" in contract) == (name in TEXTS) and ("image_processor" in contract) == (name in IMAGES)
        file, program = _described(contract)
        outputs = application_run(directory, file, program, application_feed(directory, contract, program))
        for spec in program["outputs"]:
            value = outputs[spec["name"]]
            assert str(value.dtype) == spec["dtype"] and _fits(value.shape, spec["shape"]), (name, spec, value.shape)
        found[name] = outputs
        if name in TEXTS:
            assert contract["labels"] == {"id2label": LABELS}
            assert {LABELS[str(index)] for index in outputs["logits"].argmax(-1)} <= set(LABELS.values())
            assert (directory / "tokenizer" / "tokenizer.json").is_file()
        else:
            assert "labels" not in contract
    reference = found[names[0]]
    for name, outputs in found.items():
        for output, value in outputs.items():
            numpy.testing.assert_allclose(value, reference[output], rtol=1e-3, atol=1e-4, err_msg=f"{name} {output}")


@pytest.mark.slow
def test_the_ir_keeps_the_models_names_and_shapes(every_target: Path) -> None:
    """OpenVINO's converter calls the inputs ``tensors_0``, ``tensors_1`` and leaves their
    axes open; the build names and fixes them as the program does."""
    import openvino

    model = openvino.Core().read_model(str(every_target / "build" / "text_ir" / "model.xml"))
    assert [(port.get_names(), str(port.get_partial_shape())) for port in model.inputs] == [
        ({"input_ids"}, "[2,16]"), ({"attention_mask"}, "[2,16]")]
    assert [port.get_names() for port in model.outputs] == [{"logits"}]


SNIPPETS_PAGE = REPO / "docs" / "how-to" / "use-the-outputs.md"
SNIPPET_MARKER = ("<!-- not run by the snippet tests: tests/test_consumer_every_target.py runs it against tiny built "
                  "artifacts -->")
# Each snippet's artifact, and the others of the same format it is also run against.
ALSO = {"text_onnx": ("text_ort",)}


def documented_snippets() -> list[tuple[str, str]]:
    """(artifact, code) for each snippet of the page marked as run here, and each artifact
    it is run against: its ``ARTIFACT = "build/<name>"``, and :data:`ALSO`."""
    text = SNIPPETS_PAGE.read_text()
    found = []
    for code in re.findall(re.escape(SNIPPET_MARKER) + r"\n```python\n(.*?)^```", text, flags=re.S | re.M):
        (name,) = re.findall(r'^ARTIFACT = "build/([a-z_]+)"', code, flags=re.M)
        found += [(artifact, code) for artifact in (name, *ALSO.get(name, ()))]
    return found


def test_the_page_has_a_snippet_for_every_target() -> None:
    assert sorted(artifact for artifact, _ in documented_snippets()) == ["text_ir", "text_onnx", "text_ort", "text_pte",
                                                                          "text_tflite"]


@pytest.mark.slow
@pytest.mark.parametrize(("artifact", "code"), documented_snippets(), ids=[name for name, _ in documented_snippets()])
def test_the_documented_snippets_feed_their_target(every_target: Path, artifact: str, code: str) -> None:
    """Each snippet, its ``ARTIFACT`` pointed at the tiny build, prints a label per sentence:
    the ones the ONNX graph gives."""
    pointed = re.sub(r'^ARTIFACT = "[^"]*"', f"ARTIFACT = {str(every_target / 'build' / artifact)!r}", code, flags=re.M)
    ran = subprocess.run([sys.executable, "-c", pointed], cwd=every_target, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "EDGEBUILD_REMOTE_CACHE": "off"})
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stderr
    (printed,) = [line for line in ran.stdout.splitlines() if line.startswith("['")]
    directory = every_target / "build" / "text_onnx"
    contract = json.loads((directory / "consumer.json").read_text())
    file, program = _described(contract)
    logits = application_run(directory, file, program, application_feed(directory, contract, program))["logits"]
    assert printed == str([LABELS[str(index)] for index in logits.argmax(-1)])
