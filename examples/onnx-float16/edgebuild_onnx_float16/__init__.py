"""Kind ``onnx_float16``: an ONNX graph converted to float16 for a GPU or NPU that computes
in half precision, by onnxruntime's own converter (``onnxruntime.transformers.float16``),
checked against its float32 source on onnxruntime's CPU provider.

A target from a package of its own, with a coverage certificate of its own: the format
it writes (:data:`FLOAT16_GRAPH`) answers the ``float16`` target -- which nodes compute
in float16, and which the converter kept in float32 (its op block list, and the user's)
-- so that a manifest gates it like any built-in target's::

    verify:
      coverage:
        float16: {min_fraction: 0.95, never_on_cpu: [MatMul]}

Everything it uses comes from ``edgebuild.plugin``; one entry point (``pyproject.toml``)
registers it. Nothing in edgebuild names it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgebuild.plugin import (ONNX_GRAPH, ArtifactKind, ArtifactParams, CoverageTarget, Format, OutputLimits,
                              ParameterError, Process, Starter, VerifySettings)

MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
INFO_FILE = "float16.json"

FLOAT16 = CoverageTarget(
    "float16", "float16 compute (the nodes onnxruntime's float16 converter did not keep in float32)",
    "edgebuild_onnx_float16.coverage:float16", vocabulary="ONNX op types",
)
FLOAT16_GRAPH = Format("onnx_float16_graph", "an ONNX graph computing in float16", (MODEL_FILE, WEIGHTS_FILE, INFO_FILE),
                       certificates=(FLOAT16,))


class Float16Verify(VerifySettings):
    """The float16 graph against its float32 source, output by output, on seeded inputs."""

    cosine_min: float = Field(default=0.999, ge=-1.0, le=1.0, description="Least cosine vs the float32 graph.")
    max_rel: float = Field(default=0.05, ge=0.0, description="Largest max |error| / max |float32 output|.")
    samples: int = Field(default=2, ge=1, le=16, description="Seeded random inputs.")
    seed: int = Field(default=0, description="Seed of the random inputs.")


class Float16Params(ArtifactParams):
    kind: Literal["onnx_float16"]
    source: str = Field(description="The float32 ONNX graph to convert (an hf_onnx artifact, a tower, ...).")
    keep_io_types: bool = Field(default=True, description="Keep the graph's inputs and outputs in float32.")
    op_block_list: list[str] = Field(
        default_factory=list,
        description="Op types kept in float32 beside the converter's own list (LayerNormalization, Softmax, ...).",
    )
    verify: Float16Verify = Field(default_factory=Float16Verify, description="Verification thresholds.")

    def limits(self) -> OutputLimits:
        return OutputLimits(cosine_min=self.verify.cosine_min, max_rel=self.verify.max_rel)


class OnnxFloat16(ArtifactKind[Float16Params]):
    name = "onnx_float16"
    summary = "a float32 ONNX graph -> float16 (onnxruntime's converter), with a float16 coverage certificate"
    Params = Float16Params
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    consumes = (ONNX_GRAPH,)
    produces = (ONNX_GRAPH, FLOAT16_GRAPH)
    coverage_targets = ("float16",)
    build_module = "edgebuild_onnx_float16.build"
    verify_module = "edgebuild_onnx_float16.verify"
    process = Process(memory_factor=2.0)
    starter = Starter(
        entry="""\
  # The ONNX graph above in float16, for a GPU or NPU that computes in half precision;
  # which nodes stay in float32 is its coverage certificate (target float16).
  clip_64_fp16:
    kind: onnx_float16
    description: the CLIP graph converted to float16
    source: clip_64
    verify:
      coverage:
        float16: {min_fraction: 0.9}
""",
    )

    def check_sources(self, params: Float16Params, sources: dict[str, ArtifactParams]) -> None:
        dtype = getattr(sources[params.source], "dtype", "float32")
        if dtype != "float32":
            raise ParameterError(f"source {params.source!r} is a {dtype} graph; expected a float32 one", key="source")
