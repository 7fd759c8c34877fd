"""Kind ``litert``: a model's ``torch.export`` program converted to a LiteRT ``.tflite``
(``litert_torch``, in an environment of its own where it cannot share edgebuild's:
``edgebuild/ml/toolenv.py``), for Android and microcontrollers; checked in LiteRT's
interpreter."""

from __future__ import annotations

import importlib.util

from edgebuild.ml.toolenv import missing_reason, tool_versions
from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, Starter, ParameterError

from ..torch_export.targets import check_program_source, require_package
from .params import EXTRA, INFO_FILE, MODEL_FILE, LitertParams


def converter_available() -> bool:
    """Whether litert-torch imports here, or its own environment is there."""
    return importlib.util.find_spec("litert_torch") is not None or missing_reason("litert") is None


class Litert(ArtifactKind):
    name = "litert"
    summary = "a model's torch.export program -> LiteRT .tflite"
    Params = LitertParams
    outputs = (MODEL_FILE, INFO_FILE)
    build_module = "edgebuild.kinds.litert.build"
    verify_module = "edgebuild.kinds.litert.verify"
    source_kinds = ("torch_export",)
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
    tool_environments = ("litert",)
    memory_factor = 4.0

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, Checkpoint]) -> None:
        require_package("ai_edge_litert", EXTRA, self.name)
        if not converter_available():
            raise ParameterError(f"the litert kind converts with {missing_reason('litert')}", key="kind")

    def extra_versions(self) -> dict[str, str]:
        # The converter's, wherever it runs (edgebuild's environment, or one of its own).
        if importlib.util.find_spec("litert_torch") is not None:
            from importlib import metadata

            return {"litert-torch": metadata.version("litert-torch")}
        return tool_versions("litert")

    def check_sources(self, params: ArtifactParams, sources: dict[str, ArtifactParams]) -> None:
        assert isinstance(params, LitertParams)
        check_program_source(self.name, params, sources, dynamic=False)
