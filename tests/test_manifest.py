"""The manifest: every error names file, line, key path, expected and found."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from edgebuild.errors import ManifestError
from edgebuild.core import kind as kinds_base
from edgebuild.core.registry import kind_names
from edgebuild.core.manifest import load_manifest

HEAD = """\
version: 1
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
"""

TOWER = """\
  t:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 448
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "artifacts.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ManifestError) as caught:
        load_manifest(path, environ=environ or {})
    return str(caught.value)


def test_valid_manifest_normalises_values(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + "    dtype: fp16\n    description: shown in doit list\n")
    manifest = load_manifest(path, environ={})
    params = manifest.artifacts["t"]
    assert params.image_size == (448, 448)
    assert params.dtype == "float16"
    assert params.opset == 21
    assert params.attn_implementation == "sdpa"
    assert manifest.defaults == ["t"]
    # Cosmetic fields never reach the build fingerprint.
    assert "description" not in params.build_parameters()
    assert "verify" not in params.build_parameters()


def test_rectangular_image_size(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("448", "[224, 448]"))
    assert load_manifest(path, environ={}).artifacts["t"].image_size == (224, 448)


def test_misspelt_key_has_hint(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("image_size", "image_sise"))
    assert error_of(path) == (
        f"{path}:6:3: artifacts -> t -> image_size: missing required key 'image_size'\n"
        f"{path}:9:5: artifacts -> t -> image_sise: unknown key 'image_sise' (did you mean 'image_size'?)"
    )


def test_misspelt_nested_verify_key(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + "    verify:\n      cosine_mn: 0.9\n")
    assert error_of(path) == (
        f"{path}:11:7: artifacts -> t -> verify -> cosine_mn: unknown key 'cosine_mn' (did you mean 'cosine_min'?)"
    )


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + "    opset: twenty\n")
    assert error_of(path) == (
        f"{path}:10:5: artifacts -> t -> opset: input should be a valid integer; found 'twenty'"
    )


def test_values_are_never_coerced(tmp_path: Path) -> None:
    """A quoted number is a string, as the JSON Schema says: the loader never converts it."""
    path = write(tmp_path, HEAD + TOWER + '    opset: "21"\n')
    assert error_of(path) == f"{path}:10:5: artifacts -> t -> opset: input should be a valid integer; found '21'"


def test_opset_below_dynamo_minimum(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + "    opset: 17\n")
    assert error_of(path) == (
        f"{path}:10:5: artifacts -> t -> opset: input should be greater than or equal to 18; found 17"
    )


def test_unknown_dtype(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + "    dtype: int8\n")
    assert error_of(path) == f"{path}:10:5: artifacts -> t -> dtype: input should be 'float32' or 'float16'; found 'int8'"


def test_negative_image_size(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("448", "-448"))
    assert error_of(path) == f"{path}:9:5: artifacts -> t -> image_size: image sizes must be positive; found -448"


def test_missing_kind(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("    kind: qwen3_5_vision_tower\n", ""))
    kinds = ", ".join(repr(name) for name in kind_names())
    assert error_of(path) == f"{path}:6:3: artifacts -> t: missing required key 'kind' (one of {kinds})"
    assert "'qwen3_5_vision_tower'" in kinds


def test_unknown_kind_has_hint(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("qwen3_5_vision_tower", "qwen3_5_vision_towr"))
    message = error_of(path)
    assert message.startswith(f"{path}:7:5: artifacts -> t -> kind: unknown artifact kind 'qwen3_5_vision_towr'; expected one of ")
    assert message.endswith("(did you mean 'qwen3_5_vision_tower'?)")


def test_undeclared_checkpoint(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("checkpoint: qwen", "checkpoint: qwn"))
    assert error_of(path) == (
        f"{path}:8:5: artifacts -> t -> checkpoint: undeclared checkpoint 'qwn' (declared: 'qwen') (did you mean 'qwen'?)"
    )


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + TOWER)
    assert error_of(path) == f"{path}:10:3: artifacts -> t: duplicate key (first defined on line 6)"


def test_matrix_expansion(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + """\
  tower_{image_size}_{dtype}:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    matrix:
      image_size: [224, [448, 224]]
      dtype: [fp32, fp16]
""",
    )
    manifest = load_manifest(path, environ={})
    assert list(manifest.artifacts) == ["tower_224_fp32", "tower_224_fp16", "tower_448x224_fp32", "tower_448x224_fp16"]
    assert manifest.artifacts["tower_448x224_fp16"].image_size == (448, 224)
    assert manifest.artifacts["tower_448x224_fp16"].dtype == "float16"


def test_matrix_name_collision(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + """\
  tower_448_fp32:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 448
  tower_{image_size}_fp32:
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    matrix:
      image_size: [448, 224]
""",
    )
    assert error_of(path) == (
        f"{path}:10:3: artifacts -> tower_{{image_size}}_fp32: duplicate artifact name 'tower_448_fp32' "
        "(first declared on line 6)"
    )


def test_matrix_key_missing_from_name(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD + "  tower:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    matrix:\n      image_size: [448, 224]\n",
    )
    assert error_of(path) == (
        f"{path}:6:3: artifacts -> tower: the name must contain {{image_size}} so that every matrix "
        "combination gets its own name"
    )


def test_matrix_error_names_the_expanded_artifact(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + "  t_{dtype}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 448\n"
        + "    matrix:\n      dtype: [fp32, int4]\n",
    )
    assert error_of(path) == (
        f"{path}:6:3: artifacts -> t_{{dtype}} (t_int4) -> dtype: input should be 'float32' or 'float16'; found 'int4'"
    )


def test_a_fault_every_member_of_a_matrix_shares_is_said_once(tmp_path: Path) -> None:
    """Not one line per artifact of a sweep: the first member's, then how many more."""
    path = write(
        tmp_path,
        HEAD
        + "  t_{image_size}:\n    kind: qwen3_5_vision_towr\n    checkpoint: qwen\n"
        + "    matrix:\n      image_size: [224, 256, 288, 320]\n"
        + "  u_{dtype}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 448\n"
        + "    matrix:\n      dtype: [int4, int8]\n",
    )
    lines = error_of(path).splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith(f"{path}:7:5: artifacts -> t_{{image_size}} (t_224) -> kind: unknown artifact kind "
                               "'qwen3_5_vision_towr'")
    assert lines[1] == f"{path}:6:3: artifacts -> t_{{image_size}}: the same for 3 more of its matrix"
    # Faults that differ (each member's own value) are each said.
    assert lines[2].startswith(f"{path}:11:3: artifacts -> u_{{dtype}} (u_int4) -> dtype:")
    assert lines[3].startswith(f"{path}:11:3: artifacts -> u_{{dtype}} (u_int8) -> dtype:")


def test_environment_interpolation(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    path = write(
        tmp_path,
        "checkpoints:\n  qwen:\n    path: ${QWEN_DIR:-fallback}/sub\n    fixture: qwen3_5_vl_tiny\n"
        "  other:\n    path: ${EMPTY:-}\n    fixture: qwen3_5_vl_tiny\nartifacts: {}\n",
    )
    manifest = load_manifest(path, environ={"QWEN_DIR": str(checkpoint)})
    assert manifest.checkpoints["qwen"].path == f"{checkpoint}/sub"
    assert not manifest.checkpoints["qwen"].uses_fixture
    assert load_manifest(path, environ={}).checkpoints["qwen"].path == "fallback/sub"
    assert manifest.checkpoints["other"].uses_fixture


def test_unset_environment_variable(tmp_path: Path) -> None:
    path = write(tmp_path, "checkpoints:\n  qwen:\n    path: ${NO_SUCH_VARIABLE}\nartifacts: {}\n")
    assert error_of(path) == (
        f"{path}:3:11: checkpoints -> qwen -> path: environment variable NO_SUCH_VARIABLE is not set "
        "(write ${NO_SUCH_VARIABLE:-default} to give a default)"
    )


def test_interpolated_number(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("448", "${SIZE:-448}"))
    assert load_manifest(path, environ={}).artifacts["t"].image_size == (448, 448)
    assert load_manifest(path, environ={"SIZE": "224"}).artifacts["t"].image_size == (224, 224)


def test_merge_key_shares_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + """\
  small: &tower
    kind: qwen3_5_vision_tower
    checkpoint: qwen
    image_size: 224
  large:
    <<: *tower
    image_size: 448
    dtype: int8
""",
    )
    # An error in the merging artifact points at its own line.
    assert error_of(path) == f"{path}:13:5: artifacts -> large -> dtype: input should be 'float32' or 'float16'; found 'int8'"
    path.write_text(path.read_text().replace("    dtype: int8\n", ""))
    manifest = load_manifest(path, environ={})
    assert manifest.artifacts["small"].image_size == (224, 224)
    assert manifest.artifacts["large"].image_size == (448, 448)
    assert manifest.artifacts["large"].checkpoint == "qwen"


def test_huge_integers_do_not_crash_the_manifest(tmp_path: Path) -> None:
    """Bounds per field belong to each kind's schema; the manifest layer keeps any
    integer it can print, and refuses longer ones with a message."""
    path = write(
        tmp_path,
        "checkpoints:\n  q:\n    fixture: qwen3_5_vl_tiny\n"
        "    fixture_config: {depth: 100000000000000000000000}\nartifacts: {}\n",
    )
    assert load_manifest(path, environ={}).checkpoints["q"].fixture_config == {"depth": 10**23}
    path = write(tmp_path, HEAD + TOWER + f"    opset: {'1' * 101}\n")
    assert error_of(path) == (
        f"{path}:10:12: artifacts -> t -> opset: found an integer of more than 100 digits, "
        f"{'1' * 40!r}... (101 characters); expected at most 100 digits"
    )


def test_checkpoint_without_source(tmp_path: Path) -> None:
    path = write(tmp_path, "checkpoints:\n  qwen: {}\nartifacts: {}\n")
    assert error_of(path) == f"{path}:2:3: checkpoints -> qwen: give a non-empty 'hf' or 'path', or a 'fixture'"


def test_hugging_face_checkpoint(tmp_path: Path) -> None:
    path = write(tmp_path, "checkpoints:\n  q:\n    hf: Qwen/Qwen3.5-27B-FP8\nartifacts: {}\n")
    spec = load_manifest(path, environ={}).checkpoints["q"]
    assert (spec.hf, spec.revision, spec.hf_revision, spec.uses_fixture) == ("Qwen/Qwen3.5-27B-FP8", None, "main", False)
    # Empty (an unset ${VAR:-}): the fixture is the fallback, as for an empty path.
    path = write(
        tmp_path,
        "checkpoints:\n  q:\n    hf: ${QWEN_HF:-}\n    revision: ${QWEN_REVISION:-}\n    fixture: qwen3_5_vl_tiny\n"
        "artifacts: {}\n",
    )
    assert load_manifest(path, environ={}).checkpoints["q"].uses_fixture
    spec = load_manifest(path, environ={"QWEN_HF": "org/name", "QWEN_REVISION": "v1.0"}).checkpoints["q"]
    assert (spec.hf, spec.hf_revision, spec.uses_fixture) == ("org/name", "v1.0", False)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("hf: org/name\n    path: ckpt", "2:3: checkpoints -> q: give one of 'path' and 'hf', not both"),
        ("path: ckpt\n    revision: main", "2:3: checkpoints -> q: 'revision' only applies to an 'hf' checkpoint"),
        ("hf: org--x/name", "3:5: checkpoints -> q -> hf: expected a Hugging Face repo id 'org/name' "
                            "(letters, digits, '-', '_', '.'; no '--' or '..'); found 'org--x/name'"),
        ("hf: a/b/c", "3:5: checkpoints -> q -> hf: expected a Hugging Face repo id 'org/name' "
                      "(letters, digits, '-', '_', '.'; no '--' or '..'); found 'a/b/c'"),
        ("hf: org/name\n    revision: ../../etc", "4:5: checkpoints -> q -> revision: expected a 40-hex commit, "
                                                   "or a branch or tag name; found '../../etc'"),
    ],
    ids=["hf-and-path", "revision-without-hf", "double-dash", "three-parts", "revision-escapes-refs"],
)
def test_bad_hugging_face_checkpoint(tmp_path: Path, entry: str, expected: str) -> None:
    path = write(tmp_path, f"checkpoints:\n  q:\n    {entry}\nartifacts: {{}}\n")
    assert error_of(path) == f"{path}:{expected}"


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, "checkpoint: {}\nartifacts: {}\n")
    assert error_of(path) == f"{path}:1:1: checkpoint: unknown key 'checkpoint' (did you mean 'checkpoints'?)"


def test_invalid_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "  t:\n    kind: [qwen\n")
    assert error_of(path) == (
        f"{path}:8:1: invalid YAML: expected ',' or ']', but got '<stream end>' (while parsing a flow sequence on line 7)"
    )


@pytest.mark.parametrize(("text", "found"), [("[1]\n", "a list"), ("42\n", "an integer")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, found: str) -> None:
    path = write(tmp_path, text)
    assert error_of(path) == f"{path}:1:1: (top level): expected a mapping, found {found}"


def test_empty_manifest(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    assert error_of(path) == f"{path}:1:1: (top level): expected a mapping, found an empty manifest"


def test_missing_manifest(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert error_of(path) == f"{path}: manifest not found"


def test_undeclared_default(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER + "defaults: [tt]\n")
    assert error_of(path) == f"{path}:10:1: defaults: undeclared artifact 'tt' (did you mean 't'?)"


def test_name_with_a_final_newline(tmp_path: Path) -> None:
    """``$`` in a regex also matches before a final newline; names are matched in full."""
    path = write(tmp_path, HEAD + TOWER.replace("  t:", '  "t\\n":'))
    assert error_of(path) == (
        f"{path}:6:3: artifacts -> 't\\n': artifact name 't\\n' must start with a letter or digit and contain only "
        "letters, digits, '_', '.' and '-'"
    )


@pytest.mark.parametrize("placeholder", ["{image_size:d}", "{image_size!r}", "{}", "{size.x}"])
def test_name_template_placeholders_are_plain_keys(tmp_path: Path, placeholder: str) -> None:
    path = write(
        tmp_path,
        HEAD + f"  t_{placeholder}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n"
        "    matrix:\n      image_size: [448]\n",
    )
    assert error_of(path) == (
        f"{path}:6:3: artifacts -> t_{placeholder}: bad name template: found {placeholder}; "
        "expected {key} placeholders naming matrix keys"
    )


def test_a_name_too_long_for_a_directory_is_refused_at_load(tmp_path: Path) -> None:
    """Refused by the loader (and so by ``check``), not by the build's "File name too long"
    or a traceback in ``status``."""
    name = "t" * 300
    path = write(tmp_path, HEAD + TOWER.replace("  t:", f"  {name}:"))
    assert error_of(path) == (
        f"{path}:6:3: artifacts -> {name}: artifact name {'t' * 20!r}... is 300 characters long; expected at most 100"
    )


def test_names_that_differ_only_in_case_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("  t:", "  T64:") + TOWER.replace("  t:", "  t64:"))
    assert error_of(path) == (
        f"{path}:10:3: artifacts -> t64: artifact name 't64' differs from 'T64' (line 6) only in case; expected names "
        "that differ otherwise (build/ would hold both in one directory on macOS and Windows)"
    )


@pytest.mark.parametrize("character, code", [("\\e[31m", "001B"), ("\\a", "0007"), ("\\u202e", "202E"),
                                             ("\\x9b", "009B"), ("\\u2066", "2066")])
def test_descriptions_that_would_drive_the_terminal_are_refused(tmp_path: Path, character: str, code: str) -> None:
    """ANSI escapes, BEL, C1 controls and bidi overrides would reach the terminal raw
    through ``doit list``; tabs and newlines (a folded description) are text."""
    path = write(tmp_path, HEAD + TOWER + f'    description: "a {character}b"\n')
    message = error_of(path)
    assert message.startswith(
        f"{path}:10:5: artifacts -> t -> description: expected text a terminal shows as written, found the control "
        f"character U+{code} at offset 2"
    ), message
    assert "\n" not in message and "\x1b" not in message and "\u202e" not in message
    fine = write(tmp_path, HEAD + TOWER + '    description: "two\\tcolumns\\nand lines, in \u00e9t\u00e9"\n')
    assert load_manifest(fine, environ={}).artifacts["t"].description == "two\tcolumns\nand lines, in \u00e9t\u00e9"
    # A checkpoint's description and name alike.
    aliased = write(tmp_path, HEAD.replace("  qwen:\n", '  "q\\e[2J":\n    fixture: qwen3_5_vl_tiny\n  qwen:\n') + TOWER)
    assert error_of(aliased) == (
        f"{aliased}:3:3: checkpoints -> 'q\\x1b[2J': expected a checkpoint name a terminal shows as written, found the "
        "control character U+001B at offset 1"
    )


def test_reserved_name(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + TOWER.replace("  t:", "  list:"))
    assert error_of(path) == f"{path}:6:3: artifacts -> list: artifact name 'list' is reserved (it is a doit command)"


def test_dependency_cycle(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Cycles through ``source:`` references; a test-only kind stands in for the
    artifact-to-artifact kinds."""
    from typing import Literal

    from edgebuild.core import registry

    class ChainParams(kinds_base.ArtifactParams):
        kind: Literal["test_chain"]
        source: str

    link = kinds_base.Format("test_chain_link", "a test-only link")

    class Chain(kinds_base.ArtifactKind):
        name = "test_chain"
        summary = "test-only"
        Params = ChainParams
        outputs = ("x",)
        build_module = verify_module = "edgebuild.core.kind"
        produces = consumes = (link,)

    registry.register(Chain)
    request.addfinalizer(lambda: registry.unregister("test_chain"))
    path = write(
        tmp_path,
        "artifacts:\n  a:\n    kind: test_chain\n    source: b\n  b:\n    kind: test_chain\n    source: c\n"
        "  c:\n    kind: test_chain\n    source: a\n",
    )
    assert error_of(path) == f"{path}:2:3: artifacts: dependency cycle a -> b -> c -> a"
    path = write(tmp_path, "artifacts:\n  a:\n    kind: test_chain\n    source: z\n")
    assert error_of(path) == f"{path}:4:5: artifacts -> a -> source: undeclared artifact 'z'"


def test_registration_is_checked() -> None:
    from typing import Literal

    from edgebuild.core.registry import register

    class WrongParams(kinds_base.ArtifactParams):
        kind: Literal["other"]

    class Wrong(kinds_base.ArtifactKind):
        name = "wrong"
        summary = "x"
        Params = WrongParams
        outputs = ()
        build_module = verify_module = "edgebuild.core.kind"

    with pytest.raises(TypeError, match=r"Wrong.Params.kind must be Literal\['wrong'\], found \('other',\)"):
        register(Wrong)

    class RightParams(kinds_base.ArtifactParams):
        kind: Literal["right"]

    for attribute in ("worker_imports", "build_imports", "build_warmups", "quiet_loggers"):
        kind = type("Right", (kinds_base.ArtifactKind,), {
            "name": "right", "summary": "x", "Params": RightParams, "outputs": ("out.bin",),
            "build_module": "edgebuild.core.kind", "verify_module": "edgebuild.core.kind",
            "process": kinds_base.Process(**{attribute: "torch"})})
        with pytest.raises(TypeError, match=f"artifact kind 'right': {attribute} must be a tuple of module names, "
                                            "found 'torch'"):
            register(kind)


def test_the_built_in_kinds_preimport_modules_that_exist() -> None:
    """The fork server imports a kind's ``worker_imports``, ``build_imports`` and
    ``build_warmups`` quietly (one that fails is left to the worker): a misspelt name would
    only cost every worker its import time again, so each must be a module that is there."""
    import importlib.util

    from edgebuild.core.registry import get_kind
    from edgebuild.kinds import BUILTIN_KINDS

    missing = []
    for name in BUILTIN_KINDS:
        kind = get_kind(name)
        process = kind.process
        for module in (*process.worker_imports, *process.build_imports, *process.build_warmups):
            if importlib.util.find_spec(module) is None:
                missing.append(f"{name}: {module}")
    assert missing == []
    assert "transformers.models.qwen3_5.modeling_qwen3_5" in get_kind("qwen3_5_vision_tower").process.worker_imports


def test_source_of_the_wrong_kind_is_an_error_before_anything_is_built(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\n"
        "artifacts:\n  tower:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: 64\n"
        "  graph:\n    kind: siglip_f143_onnx\n    source: tower\n",
    )
    assert error_of(path) == (
        f"{path}:11:5: artifacts -> graph -> source: 'tower' is a qwen3_5_vision_tower artifact, which writes an ONNX "
        "graph and a fixed-shape Qwen3.5 vision tower graph; a siglip_f143_onnx artifact takes a SigLIP encoder on the "
        "F143 grid (a source of kind siglip_f143)"
    )
    # A target takes any kind that writes the format it consumes: a QNN context, any QDQ graph.
    path = write(
        tmp_path,
        "checkpoints:\n  clip:\n    fixture: clip_vision_tiny\n"
        "artifacts:\n  clip:\n    kind: hf_onnx\n    checkpoint: clip\n    model_class: CLIPVisionModel\n"
        "    inputs: {pixel_values: [1, 3, 64, 64]}\n  ctx:\n    kind: qnn_context\n    source: clip\n",
    )
    assert error_of(path) == (
        f"{path}:12:5: artifacts -> ctx -> source: 'clip' is a hf_onnx artifact, which writes an ONNX graph and an "
        "exported ONNX graph with its inputs' signature; a qnn_context artifact takes a QDQ graph (a source of kind "
        "onnx_qdq or qwen3_5_tower_qdq)"
    )


def test_every_kind_has_a_fixture_and_a_test_module() -> None:
    from edgebuild.core.registry import fixtures, get_kind
    from edgebuild.kinds import BUILTIN_KINDS
    from helpers import REPO, kind_fixtures

    for name in BUILTIN_KINDS:
        assert kind_fixtures(name), f"kind {name} has no generated checkpoint to be tested on"
        assert kind_fixtures(name) <= set(fixtures())
        package = type(get_kind(name)).__module__.rsplit(".", 1)[-1]
        assert (REPO / "tests" / f"test_{package}.py").is_file(), f"kind {name} has no tests/test_{package}.py"
