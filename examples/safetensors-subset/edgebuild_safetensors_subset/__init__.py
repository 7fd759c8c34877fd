"""Kind ``safetensors_subset``: the tensors of a checkpoint under some name prefixes, as
one SafeTensors file (optionally cast), checked tensor by tensor against the checkpoint.

An edgebuild kind from a package of its own: everything it uses comes from
``edgebuild.plugin``, and one entry point (``pyproject.toml``) registers it.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgebuild.plugin import ArtifactKind, ArtifactParams, Checkpoint, ParameterError, Starter, Strict, TensorSelection

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "subset.json"


class SubsetVerify(Strict):
    max_abs: float = Field(default=0.0, ge=0.0, description="Largest |stored - checkpoint| after the cast (0: exact).")


class SubsetParams(ArtifactParams):
    kind: Literal["safetensors_subset"]
    checkpoint: str
    prefixes: list[str] = Field(min_length=1, description="Tensor name prefixes to keep (model.visual., ...).")
    strip_prefix: str = Field(default="", description="Removed from the front of every stored name.")
    dtype: Literal["keep", "float32", "float16", "bfloat16"] = "keep"
    verify: SubsetVerify = Field(default_factory=SubsetVerify)

    DTYPES: ClassVar[tuple[str, ...]] = ("float32", "float16", "bfloat16")


class SafetensorsSubset(ArtifactKind[SubsetParams]):
    name = "safetensors_subset"
    summary = "a checkpoint's tensors under some prefixes -> one SafeTensors file"
    Params = SubsetParams
    outputs = (WEIGHTS_FILE, INFO_FILE)
    build_module = "edgebuild_safetensors_subset.build"
    verify_module = "edgebuild_safetensors_subset.verify"
    starter = Starter(
        checkpoints={"qwen3_5": "qwen3_5_vl_tiny"},
        entry="""\
  # The vision tower's weights alone, as one float16 SafeTensors file.
  tower_weights:
    kind: safetensors_subset
    checkpoint: qwen3_5
    prefixes: [model.visual.]
    strip_prefix: model.visual.
    dtype: float16
""",
    )

    def tensor_selection(self, params: SubsetParams, checkpoint: Checkpoint) -> TensorSelection:
        # Exactly the tensors it stores; config.json is not read.
        return TensorSelection(prefixes=tuple(params.prefixes), config_key=None)

    def check_parameters(self, params: SubsetParams, checkpoints: dict[str, Checkpoint]) -> None:
        checkpoint = checkpoints[params.checkpoint]
        selected = checkpoint.select(tuple(params.prefixes))
        names = [name.removeprefix(params.strip_prefix) for name in selected]
        if len(set(names)) != len(names):
            raise ParameterError(f"removing {params.strip_prefix!r} makes two tensors share a name", key="strip_prefix")
