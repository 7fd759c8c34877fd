"""The manifest's JSON Schema (``python -m edgebuild schema``) accepts exactly what the
loader accepts: every manifest of the repository, the README's snippets and the test
manifests pass both; the invalid manifests of the tests fail both."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from edgebuild.errors import ManifestError
from edgebuild.core.manifest import load_manifest, manifest_json_schema
from edgebuild.cli.scaffold import starter_manifest

from helpers import REPO, TOWER_MANIFEST

HEAD = """\
version: 1
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
  siglip:
    path: ckpt
artifacts:
"""
TOWER = "  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 448\n"
SIGLIP = (
    "  q:\n    kind: siglip_f143\n    checkpoint: siglip\n    calibration:\n      images: [data/calibration/*.png]\n"
)


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = manifest_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def schema_errors(validator: jsonschema.Draft202012Validator, text: str) -> list[str]:
    """What the schema says of ``text`` as an editor sees it: the YAML before any
    ``${VAR}`` is substituted."""
    return [f"{'/'.join(map(str, error.path))}: {error.message}" for error in validator.iter_errors(yaml.safe_load(text))]


def loader_error(tmp_path: Path, text: str) -> str | None:
    path = tmp_path / "artifacts.yaml"
    path.write_text(text)
    try:
        load_manifest(path, environ={})
    except ManifestError as error:
        return str(error)
    return None


def documented_yaml() -> list[str]:
    """Every YAML snippet of the README and the documentation's hand-written pages (the
    generated reference quotes the starter entries, which are checked as the starter)."""
    pages = [REPO / "README.md", *sorted(path for path in (REPO / "docs").rglob("*.md") if "reference" not in path.parts)]
    return [block for page in pages for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)]


def whole_manifests() -> list[str]:
    """The snippets that are a manifest of their own (checkpoints and artifacts)."""
    return [block for block in documented_yaml() if block.startswith("checkpoints:") and "\nartifacts:" in block]


def readme_manifest() -> str:
    """One manifest made of the documentation's snippets: the full manifest, the artifact
    entries of each kind's page, and the top-level ``remote_cache``."""
    blocks = documented_yaml()
    full = [block for block in blocks if block.startswith("version:")]
    entries = [block for block in blocks if block.startswith("  ")]
    top_level = [block for block in blocks if not block.startswith(("version:", "  ", "checkpoints:"))]
    assert len(full) == 1 and entries and top_level, "the documentation's manifest snippets moved: update this test"
    text = full[0].replace("checkpoints:\n", "checkpoints:\n  siglip:\n    path: ckpt\n  clip:\n    path: ckpt\n", 1)
    return text + "".join(entries) + "".join(top_level)


def readme_checkpoint_snippets() -> str:
    """The documentation's ``checkpoints:`` examples (the Hugging Face form), as one manifest."""
    whole = whole_manifests()
    checkpoints = [block for block in documented_yaml() if block.startswith("checkpoints:") and block not in whole]
    assert checkpoints, "the documentation's checkpoint snippets moved: update this test"
    return "".join(checkpoints) + "artifacts: {}\n"


def test_the_command_prints_the_schema() -> None:
    result = subprocess.run([sys.executable, "-m", "edgebuild", "schema"], capture_output=True, text=True, check=True)
    schema = json.loads(result.stdout)
    assert schema == manifest_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    tower = schema["$defs"]["TowerParams"]
    assert tower["additionalProperties"] is False
    assert {"image_size", "dtype", "opset", "attn_implementation", "verify"} <= set(tower["properties"])
    from edgebuild.core.registry import kind_names

    assert schema["$defs"]["Artifact"]["properties"]["kind"]["enum"] == kind_names()


VALID = {
    "the repository's artifacts.yaml": (REPO / "artifacts.yaml").read_text(),
    "the documentation's snippets": readme_manifest(),
    "the documentation's checkpoint snippets": readme_checkpoint_snippets(),
    **{f"the documentation's whole manifest #{number}": text for number, text in enumerate(whole_manifests(), 1)},
    "the starter manifest of init": starter_manifest(),
    "the starter manifest of init --plugins": starter_manifest(plugins=True),
    "the tests' one-tower manifest": TOWER_MANIFEST,
    "a rectangular image": HEAD + TOWER.replace("448", "[224, 448]"),
    "dtype aliases": HEAD + TOWER + "    dtype: half\n",
    "a matrix over every required key": HEAD
    + "  t_{image_size}_{dtype}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n"
    "    matrix:\n      image_size: [224, [448, 224]]\n      dtype: [fp32, fp16]\n",
    "interpolated scalars": HEAD + TOWER.replace("448", "${SIZE:-448}") + "    opset: ${OPSET:-21}\n",
    "a checkpoint path from the environment": "checkpoints:\n  qwen:\n    path: ${QWEN:-}\n    fixture: qwen3_5_vl_tiny\n"
    "artifacts:\n" + TOWER,
    "anchors and merge keys": HEAD
    + "  a: &tower\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 224\n"
    "  b:\n    <<: *tower\n    dtype: fp16\n",
    "SigLIP with every option": HEAD + SIGLIP + "    layers: 1\n    algorithm: nearest\n    device: auto\n"
    "    verify:\n      cosine_min: 0.9\n      max_abs: null\n",
    "an ONNX export of a SigLIP artifact": HEAD + SIGLIP + "  o:\n    kind: siglip_f143_onnx\n    source: q\n    dtype: fp16\n",
    "coverage targets and gates": HEAD + TOWER + "    verify:\n      coverage:\n        targets: [nnapi, directml]\n"
    "        directml: {min_fraction: 1.0, max_partitions: 1, never_on_cpu: [Attention, MatMul]}\n"
    "        coreml: {max_partitions: 1}\n",
}


@pytest.mark.parametrize("text", VALID.values(), ids=VALID.keys())
def test_what_the_loader_accepts_the_schema_accepts(text: str, tmp_path: Path, validator) -> None:
    assert loader_error(tmp_path, text) is None
    assert schema_errors(validator, text) == []


# Each is an error of one document alone (what a schema can say), with the loader's message.
INVALID = {
    "misspelt key": (HEAD + TOWER.replace("image_size", "image_sise"), "unknown key 'image_sise'"),
    "misspelt verify key": (HEAD + TOWER + "    verify:\n      cosine_mn: 0.9\n", "unknown key 'cosine_mn'"),
    "a word for a number": (HEAD + TOWER + "    opset: twenty\n", "input should be a valid integer; found 'twenty'"),
    "a quoted number": (HEAD + TOWER + '    opset: "21"\n', "input should be a valid integer; found '21'"),
    "opset too low": (HEAD + TOWER + "    opset: 17\n", "greater than or equal to 18"),
    "unknown dtype": (HEAD + TOWER + "    dtype: int8\n", "input should be 'float32' or 'float16'"),
    "negative image size": (HEAD + TOWER.replace("448", "-448"), "image sizes must be positive"),
    "three image sides": (HEAD + TOWER.replace("448", "[1, 2, 3]"), "image_size"),
    "a boolean for an integer": (HEAD + TOWER + "    opset: true\n", "input should be a valid integer"),
    "no kind": (HEAD + TOWER.replace("    kind: qwen3_5_vision_tower\n", ""), "missing required key 'kind'"),
    "unknown kind": (HEAD + TOWER.replace("qwen3_5_vision_tower", "qwen3_5_vision_towr"), "unknown artifact kind"),
    "missing required parameter": (HEAD + TOWER.replace("    image_size: 448\n", ""), "missing required key 'image_size'"),
    "a placeholder without a matrix": (
        HEAD + TOWER.replace("  t:", "  t_{image_size}:"), "the name uses {image_size} but the entry has no 'matrix'"
    ),
    "a matrix without a placeholder": (
        HEAD + "  t:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n      image_size: [448]\n",
        "the name must contain {image_size}",
    ),
    "a key both in and out of the matrix": (
        HEAD + "  t_{image_size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 224\n"
        "    matrix:\n      image_size: [448]\n",
        "set both directly and in 'matrix'",
    ),
    "a matrix missing a required key": (
        HEAD + "  t_{dtype}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n      dtype: [fp16]\n",
        "missing required key 'image_size'",
    ),
    "a bad value in a matrix": (
        HEAD + "  t_{image_size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n      image_size: [448, big]\n",
        "image_size",
    ),
    "an empty matrix list": (
        HEAD + "  t_{image_size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n      image_size: []\n",
        "expected a non-empty list of values",
    ),
    "a kind in a matrix": (
        HEAD + "  t_{kind}:\n    checkpoint: qwen\n    image_size: 448\n    matrix:\n      kind: [qwen3_5_vision_tower]\n",
        "the kind cannot vary in a matrix",
    ),
    "a reserved name": (HEAD + TOWER.replace("  t:", "  build:"), "artifact name 'build' is reserved"),
    "no calibration": (
        HEAD + SIGLIP.replace("images: [data/calibration/*.png]", "images: []"),
        "calibration needs at least one pixel_values file or image",
    ),
    "no layers": (HEAD + SIGLIP + "    layers: 0\n", "layers must be at least 1"),
    "a checkpoint with no source": (
        "checkpoints:\n  qwen:\n    description: nothing\nartifacts:\n" + TOWER, "give a non-empty 'hf' or 'path', or a 'fixture'"
    ),
    "fixture_config without a fixture": (
        "checkpoints:\n  qwen:\n    path: ckpt\n    fixture_config: {depth: 1}\nartifacts:\n" + TOWER,
        "'fixture_config' only applies to a 'fixture' checkpoint",
    ),
    "another version": (HEAD.replace("version: 1", "version: 2") + TOWER, "version: input should be 1"),
    "an unknown top-level key": ("artefacts: {}\n" + HEAD + TOWER, "unknown key 'artefacts'"),
    "artifacts as a list": ("artifacts: [t]\n", "artifacts: input should be a valid dictionary"),
    "an unknown coverage target": (
        HEAD + TOWER + "    verify:\n      coverage:\n        targets: [webgpu]\n", "unknown coverage target 'webgpu'"
    ),
    "a coverage gate on an unknown target": (
        HEAD + TOWER + "    verify:\n      coverage:\n        webgpu: {min_fraction: 1.0}\n",
        "unknown coverage target 'webgpu'; this artifact's kind can be certified for nnapi, coreml, directml"
    ),
    "a coverage gate on another kind's target": (
        HEAD + TOWER + "    verify:\n      coverage:\n        qnn_htp: {max_partitions: 1}\n",
        "unknown coverage target 'qnn_htp'"
    ),
    "a coverage fraction above one": (
        HEAD + TOWER + "    verify:\n      coverage:\n        directml: {min_fraction: 2}\n", "less than or equal to 1"
    ),
    "an ONNX opset below 21": (HEAD + SIGLIP + "  o:\n    kind: siglip_f143_onnx\n    source: q\n    opset: 20\n", "opset"),
}


@pytest.mark.parametrize(("text", "message"), INVALID.values(), ids=INVALID.keys())
def test_what_the_loader_refuses_the_schema_refuses(text: str, message: str, tmp_path: Path, validator) -> None:
    error = loader_error(tmp_path, text)
    assert error is not None and message in error, error
    assert schema_errors(validator, text) != []


def test_what_only_the_loader_can_say(tmp_path: Path, validator) -> None:
    """References and checkpoint-dependent checks need more than one document: the
    schema lets them through, the loader (or the build) does not."""
    undeclared = HEAD + TOWER.replace("checkpoint: qwen", "checkpoint: qwn")
    assert schema_errors(validator, undeclared) == []
    assert "undeclared checkpoint 'qwn'" in loader_error(tmp_path, undeclared)


def test_every_kind_documents_its_parameters() -> None:
    """Editors show descriptions: every kind's parameters carry the schema's type and
    the ``${VAR}`` alternative where a scalar other than a string is expected."""
    schema = manifest_json_schema()
    opset = schema["$defs"]["TowerParams"]["properties"]["opset"]
    assert opset == {
        "anyOf": [{"maximum": 28, "minimum": 18, "type": "integer"}, {"$ref": "#/$defs/Interpolation"}],
        "title": "Opset",
        "description": "ONNX opset (16-bit QDQ needs 21).",
        "default": 21,
    }
    pattern = re.compile(schema["$defs"]["Interpolation"]["pattern"])
    assert pattern.match("${SIZE}") and pattern.match("${SIZE:-448}") and pattern.match("${X:-}")
    assert not pattern.match("${SIZE") and not pattern.match("$SIZE") and not pattern.match("${1X}")
    assert not pattern.match("${A:-${B}}")


def test_schema_file_of_init_is_the_schema(tmp_path: Path) -> None:
    from edgebuild.cli.scaffold import SCHEMA_FILE, init_project

    init_project(tmp_path)
    # The plugins' kinds by name only: init imports none unless asked (--plugins).
    assert json.loads((tmp_path / SCHEMA_FILE).read_text()) == manifest_json_schema(plugins=False)
    init_project(tmp_path / "with", plugins=True)
    assert json.loads((tmp_path / "with" / SCHEMA_FILE).read_text()) == manifest_json_schema()
    assert (tmp_path / "artifacts.yaml").read_text().splitlines()[0] == f"# yaml-language-server: $schema=./{SCHEMA_FILE}"

