"""Kind ``litert``: a model's program converted to a ``.tflite`` by litert-torch (in an
environment of its own), run in LiteRT's interpreter."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgebuild.errors import ParameterError
from edgebuild.run.workspace import Workspace

from test_targets import CLIP


def test_a_missing_converter_is_one_line_naming_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("litert_torch") is not None:
        pytest.fail("litert-torch imports in edgebuild's environment; the test set-up keeps it in its own")
    monkeypatch.setenv("EDGEBUILD_LITERT_PYTHON", str(tmp_path / "nowhere" / "bin" / "python"))
    (tmp_path / "artifacts.yaml").write_text(CLIP)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    with pytest.raises(ParameterError) as caught:
        workspace.check(workspace.artifact("clip_tflite"))
    assert str(caught.value).endswith(
        f"artifacts -> clip_tflite -> kind: the litert kind converts with litert_torch runs in an environment of its "
        f"own, and there is none at {tmp_path / 'nowhere' / 'bin' / 'python'}: python -m edgebuild toolenv litert makes "
        "it (or set EDGEBUILD_LITERT_PYTHON)")


def test_the_converters_versions_are_in_the_fingerprint(tmp_path: Path) -> None:
    from edgebuild.kinds.litert.environment import LITERT_CONVERTER
    from edgebuild.targets.toolenv import tool_versions

    from helpers import pretend_built

    (tmp_path / "artifacts.yaml").write_text(CLIP)
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path)
    pretend_built(workspace, "clip_et.torch_export")
    versions = workspace.record(workspace.artifact("clip_tflite")).versions
    assert versions["litert:litert-torch"] == tool_versions(LITERT_CONVERTER)["litert:litert-torch"] == "0.10.0"
    assert versions["ai-edge-litert"] == "2.3.0"


def test_code_digests_cover_exactly_what_builds_and_judges_it() -> None:
    from helpers import assert_code_digests

    common = [
        "edgebuild/kinds/litert/params.py", "edgebuild/models/fields.py", "edgebuild/models/inputs.py",
        "edgebuild/targets/formats.py", "edgebuild/targets/params.py", "edgebuild/targets/program.py",
    ]
    assert_code_digests(
        "litert",
        build=[*common,
               "edgebuild/core/runner.py", "edgebuild/kinds/litert/build.py", "edgebuild/kinds/litert/convert.py",
               "edgebuild/kinds/litert/environment.py", "edgebuild/kinds/litert/signature.py",
               "edgebuild/targets/folding.py"],
        verify=[*common,
                "edgebuild/kinds/litert/signature.py", "edgebuild/kinds/litert/verify.py", "edgebuild/targets/judging.py"],
    )


def test_numbers_read_from_the_programs_constants_are_folded_before_conversion() -> None:
    """What made the Qwen3.5 tower fail in LiteRT's converter (JAX has no value for a
    read of a buffer's number): the read, the checks export adds on it and a split into
    one piece are folded away; the module computes what it did; a read of an input stays."""
    import torch

    from edgebuild.targets.folding import fold_constant_scalars

    class Segments(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cu_seqlens", torch.tensor([0, 6]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            lengths = self.cu_seqlens[1:] - self.cu_seqlens[:-1]
            pieces = torch.split(x, lengths.tolist(), dim=1)
            return torch.cat([piece.softmax(-1) for piece in pieces], dim=1) * x.sum().item()

    example = (torch.randn(2, 6),)
    module = torch.export.export(Segments(), example).module()

    def ops(graph_module: torch.nn.Module) -> list[str]:
        return [node.target._schema.name for node in graph_module.graph.nodes
                if node.op == "call_function" and hasattr(node.target, "_schema")]

    assert ops(module).count("aten::_local_scalar_dense") + ops(module).count("aten::item") == 2
    expected = module(*example)
    assert fold_constant_scalars(module, example) == 1
    after = ops(module)
    # The input's sum is read still; the buffer's length, its checks and the split are gone.
    assert after.count("aten::_local_scalar_dense") + after.count("aten::item") == 1
    assert "aten::split_with_sizes" not in after and "aten::_assert_scalar" not in after
    torch.testing.assert_close(module(*example), expected)
    other = (torch.randn(2, 6),)
    torch.testing.assert_close(module(*other), Segments()(*other))


def test_the_converters_environment_pins_torch_and_ml_dtypes_as_edgebuild_does() -> None:
    """The converter loads a program that edgebuild's torch saved, and imports ml_dtypes
    (0.7.0 takes a second to): its environment's pins are the ones pyproject.toml holds."""
    import re
    import tomllib

    from edgebuild.kinds.litert.environment import LITERT_CONVERTER

    from helpers import REPO

    requirements = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {re.split(r"[=<>~!;\[ ]", requirement, maxsplit=1)[0]: requirement for requirement in requirements}
    packages = LITERT_CONVERTER.packages
    assert [pins[name] for name in ("torch", "ml_dtypes") if pins[name] not in packages] == []


def test_ids_go_in_as_the_converted_model_declares() -> None:
    """The converter turns int64 ids and masks into int32: verification fed int64 and died
    with a traceback (issue 60). Values are cast where every one survives, and said otherwise."""
    import numpy

    from edgebuild.errors import NotRunnable
    from edgebuild.kinds.litert.verify import as_declared

    ids = numpy.array([[2, 38, 14, 3]], dtype=numpy.int64)
    cast = as_declared(ids, numpy.int32, "input_ids")
    assert cast.dtype == numpy.int32 and cast.tolist() == ids.tolist()
    assert as_declared(ids, numpy.int64, "input_ids") is ids
    assert as_declared(numpy.ones(2, "float32"), numpy.float16, "x").dtype == numpy.float16
    with pytest.raises(NotRunnable, match=r"input input_ids: values from 0 to 4294967296 do not fit the int32"):
        as_declared(numpy.array([0, 2 ** 32], dtype=numpy.int64), numpy.int32, "input_ids")
    with pytest.raises(NotRunnable, match="declares int32, and the input is float32"):
        as_declared(numpy.ones(2, "float32"), numpy.int32, "x")


@pytest.mark.slow
def test_a_text_model_runs_on_litert_judged_on_its_sentences(tmp_path: Path) -> None:
    """Issue 60's DistilBERT: its int64 ids and mask declared, converted (int32 in the
    file), verified in LiteRT's interpreter on sentences through its tokenizer."""
    import json

    from helpers import lay_out_project
    from test_repeatable import TEXT

    text_to_litert = TEXT.replace("  text:\n    kind: hf_onnx", "  text_tflite:\n    kind: litert").replace("[2, 16]", "[1, 16]")
    project = lay_out_project(tmp_path, text_to_litert)
    (tmp_path / "sentences.txt").write_text("the cat was fast\na big red house\n")
    verified = project.doit("verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "Traceback" not in verified.stdout + verified.stderr
    signature = json.loads((tmp_path / "build" / "text_tflite" / "litert.json").read_text())
    assert {item["dtype"] for item in signature["inputs"]} == {"int32"}
    report = json.loads((tmp_path / "build" / "text_tflite" / "report.json").read_text())
    assert report["passed"] and report["metrics"]["inputs"] == (
        "2 batches of held-out texts (of text_tflite.torch_export) and 2 random inputs")
