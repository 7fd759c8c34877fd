"""``consumer.json``: a deployment job feeds a built tower from what the build
carries alone -- the image processor's settings and the graph's input layout -- and
the contract is a function of the fingerprint (a processor file outside it is never
read into it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
from PIL import Image

from edgebuild.core.consumer import CONSUMER_FILE, graph_signature

from helpers import clone_project


def test_a_tower_is_fed_from_its_consumer_contract_alone(verified_seed: Path, tmp_path: Path) -> None:
    built = verified_seed / "build" / "t"
    contract = json.loads((built / CONSUMER_FILE).read_text())
    assert contract["format"] == 1
    # The processor's settings are the checkpoint's own file, byte for byte as JSON.
    (processor_file,) = (verified_seed / "cache" / "fixtures").glob("qwen3_5_vl_tiny-*/preprocessor_config.json")
    checkpoint = json.loads(processor_file.read_text())
    assert contract["image_processor"] == {"checkpoint": "qwen", "file": "preprocessor_config.json", "config": checkpoint}
    (graph,) = contract["graphs"].values()
    assert graph == graph_signature(built / "model.onnx")
    (patches,) = graph["inputs"]

    # A consumer with transformers: the named processor, built from the settings alone,
    # turns an image into exactly the input the graph declares, and onnxruntime runs it.
    import transformers

    preprocessing = contract["preprocessing"]
    assert preprocessing["image_size"] == [64, 64]
    config = contract["image_processor"]["config"] | preprocessing["image_processor_overrides"]
    config.pop("processor_class", None)
    processor = getattr(transformers, config.pop("image_processor_type"))(**config)
    height, width = preprocessing["image_size"]
    photo = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 200, 3), dtype=np.uint8))
    image = photo.resize((width, height))
    pixel_values = processor(images=image, return_tensors="np")["pixel_values"].astype(patches["dtype"])
    assert list(pixel_values.shape) == patches["shape"]
    session = onnxruntime.InferenceSession(str(built / "model.onnx"), providers=["CPUExecutionProvider"])
    (output,) = session.run(None, {patches["name"]: pixel_values})
    assert list(output.shape) == graph["outputs"][0]["shape"] and np.isfinite(output).all()


def test_the_processor_file_it_carries_is_in_the_fingerprint(verified_seed: Path, tmp_path: Path) -> None:
    """The contract carries the checkpoint's processor settings, so a change to them makes
    the tower stale (its consumer.json would change) although the graph would not."""
    project = clone_project(verified_seed, tmp_path / "clone")
    before = project.project().artifact("t").fingerprint
    (processor_file,) = (project.root / "cache" / "fixtures").glob("qwen3_5_vl_tiny-*/preprocessor_config.json")
    config = json.loads(processor_file.read_text())
    config["image_mean"] = [0.48, 0.46, 0.41]
    processor_file.write_text(json.dumps(config))
    assert project.project().artifact("t").fingerprint != before
    status = project.doit("status")
    assert status.stdout.startswith("t  stale"), status.stdout
    assert "preprocessor_config.json" in status.stdout, status.stdout
