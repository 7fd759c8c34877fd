"""Kind ``litert``: a model's ``torch.export`` program converted to a LiteRT ``.tflite``
(``litert_torch``, in an environment of its own where it cannot share edgebuild's:
``environment.py``), for Android and microcontrollers; checked in LiteRT's interpreter."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from edgebuild.plugin import Checkpoint, ParameterError, Process, Starter
from edgebuild.targets.base import ProgramTarget
from edgebuild.targets.toolenv import missing_reason, tool_versions

from .environment import LITERT_CONVERTER, converter_here
from .params import EXTRA, INFO_FILE, MODEL_FILE, LitertParams


def converter_available() -> bool:
    """Whether litert-torch imports here, or its own environment is there."""
    return converter_here() or missing_reason(LITERT_CONVERTER) is None


class Litert(ProgramTarget[LitertParams]):
    name = "litert"
    summary = "a model's torch.export program -> LiteRT .tflite"
    Params = LitertParams
    outputs = (MODEL_FILE, INFO_FILE)
    build_module = "edgebuild.kinds.litert.build"
    verify_module = "edgebuild.kinds.litert.verify"
    requires = ("ai_edge_litert",)
    extra = EXTRA
    # The converter traces one shape: a program with dynamic axes is refused before it is built.
    takes_dynamic_shapes = False
    starter = Starter(
        entry="""\
  # That program for Android: a LiteRT .tflite, run in LiteRT's interpreter. Its converter
  # lives in an environment of its own: python -m edgebuild toolenv litert.
  clip_64_tflite:
    kind: litert
    description: the CLIP encoder at 64x64 (litert)
    source: clip_64_program
""",
        extra="litert",
        extra_module="litert_torch",
        install="pip install 'edgebuild[litert]' and python -m edgebuild toolenv litert",
        ready=lambda: converter_available() and importlib.util.find_spec("ai_edge_litert") is not None,
    )
    tool_packages = ("ai-edge-litert",)
    tool_environments = (LITERT_CONVERTER,)
    process = Process(memory_factor=4.0)

    def check_parameters(self, params: LitertParams, checkpoints: dict[str, Checkpoint]) -> None:
        super().check_parameters(params, checkpoints)
        if not converter_available():
            raise ParameterError(f"the litert kind converts with {missing_reason(LITERT_CONVERTER)}", key="kind")

    def extra_versions(self) -> dict[str, str]:
        # The converter's, wherever it runs (edgebuild's environment, or one of its own).
        if converter_here():
            from importlib import metadata

            return {"litert-torch": metadata.version("litert-torch")}
        return tool_versions(LITERT_CONVERTER)

    def consumer_programs(self, params: LitertParams, out_dir: Path, sources: dict[str, Path]) -> dict[str, Any]:
        from edgebuild.targets.program import program_info

        # In the build module, so that its code is in the fingerprint.
        from .build import program_signature

        assert params.source is not None
        return {MODEL_FILE: program_signature(out_dir / MODEL_FILE, program_info(sources[params.source]))}
