"""Model families: what module a model description names, at which shapes, and how an
image becomes its inputs. The targets know nothing of them: they lower the program a
family's module exports to.

- ``transformers`` (every class but those another family claims): the class named by
  ``model_class``, loaded strictly with its own ``from_pretrained``; with ``submodule``,
  the module at that attribute path alone, with only its own inputs;
- ``qwen3_5_vision_tower`` (``model_class: Qwen3_5VisionModel``): transformers' tower at a
  fixed ``image_size`` through the fixed-shape wrapper of the ``qwen3_5_vision_tower``
  kind, its input the processor's ``patches``, its output the merged tokens, ``embeds``.

A family from another package is an entry point of the group ``edgebuild.models`` named
after the ``model_class`` it claims, pointing at an object with this module's
:class:`Family` methods; the artifact's build fingerprint follows its module's code.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib import metadata
from typing import TYPE_CHECKING, Any

from edgebuild.plugin import CheckpointError, ExportError, ParameterError, TensorSelection, TensorSpec

if TYPE_CHECKING:
    import torch

    from edgebuild.core.checkpoint import Checkpoint

    from .params import ModelFields

MODELS_GROUP = "edgebuild.models"
PREPROCESSOR_FILE = "preprocessor_config.json"


class Family:
    """What a model family answers for a model description ``params`` and its checkpoint."""

    name = "family"
    default_outputs: tuple[str, ...] = ()

    def check(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        """:class:`ParameterError` (with the key) for a description this family cannot build."""

    def selection(self, params: "ModelFields", checkpoint: "Checkpoint") -> TensorSelection:
        """The part of the checkpoint the module reads."""
        raise NotImplementedError

    def outputs(self, params: "ModelFields") -> list[str]:
        return list(params.outputs or self.default_outputs)

    def inputs(self, params: "ModelFields", checkpoint: "Checkpoint") -> list[TensorSpec]:
        """The inputs at their largest shapes, in the module's order."""
        raise NotImplementedError

    def module(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        """The module exported, in float32, in eval mode: ``forward(*inputs)`` returns the
        outputs as a tuple."""
        raise NotImplementedError

    def reference(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        """The model's own forward, as :meth:`module` is called: what the program and every
        target made from it are judged against (by default :meth:`module` itself)."""
        return self.module(params, checkpoint)

    def examples(self, params: "ModelFields", checkpoint: "Checkpoint", shapes: dict[str, list[int]], count: int,
                 seed: int) -> list[tuple[Any, ...]]:
        """``count`` seeded inputs at ``shapes`` (name -> shape)."""
        raise NotImplementedError

    def image_feeds(self, params: "ModelFields", checkpoint: "Checkpoint", images: list[Any]) -> list[dict[str, Any]]:
        """Images (paths or RGB images) through the checkpoint's own image processor, one feed per run."""
        raise CheckpointError(f"{params.model_class}: the {self.name} family takes no images")


class TransformersFamily(Family):
    """Any transformers class, loaded strictly; optionally one of its modules alone."""

    name = "transformers"
    default_outputs = ("last_hidden_state",)

    def check(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        from edgebuild.ml.hf import transformers_class

        if not params.inputs:
            raise ParameterError(f"{params.model_class} needs its inputs: name -> shape", key="inputs")
        if params.image_size is not None:
            raise ParameterError("image_size is the Qwen3.5 tower's (model_class: Qwen3_5VisionModel); give inputs",
                                 key="image_size")
        architectures = checkpoint.config.get("architectures")
        if not (isinstance(architectures, list) and params.model_class in architectures):
            try:
                transformers_class(params.model_class, "model_class")
            except ExportError as error:
                raise ParameterError(str(error).removeprefix("model_class: "), key="model_class") from None

    def selection(self, params: "ModelFields", checkpoint: "Checkpoint") -> TensorSelection:
        prefixes = tuple(params.tensor_prefixes) if params.tensor_prefixes is not None else ("",)
        files = (PREPROCESSOR_FILE,) if params.held_out.images else ()
        return TensorSelection(prefixes=prefixes, config_key=None, files=files)

    def inputs(self, params: "ModelFields", checkpoint: "Checkpoint") -> list[TensorSpec]:
        assert params.inputs is not None
        return [TensorSpec(name, tuple(spec.at("largest")), params.input_dtype(name)) for name, spec in params.inputs.items()]

    def _model(self, params: "ModelFields", checkpoint: "Checkpoint") -> Any:
        from ..hf_onnx.model import load_model

        model = load_model(params, checkpoint)  # type: ignore[arg-type]
        for part in (params.submodule or "").split(".") if params.submodule else ():
            inner = getattr(model, part, None)
            if inner is None or not hasattr(inner, "forward"):
                raise ExportError(f"submodule: {params.model_class} has no module {params.submodule!r} "
                                  f"({part!r} is not one of its modules)")
            model = inner
        return model

    def module(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        from ..hf_onnx.model import named_outputs_module

        return named_outputs_module(self._model(params, checkpoint), list(params.inputs or {}), self.outputs(params))

    def examples(self, params: "ModelFields", checkpoint: "Checkpoint", shapes: dict[str, list[int]], count: int,
                 seed: int) -> list[tuple[Any, ...]]:
        from ..hf_onnx.model import checkpoint_config, random_inputs

        sized = params.model_copy(update={"inputs": {name: spec.model_copy(update={"shape": shapes[name]})
                                                      for name, spec in (params.inputs or {}).items()}})
        return random_inputs(sized, checkpoint_config(checkpoint), count, seed)  # type: ignore[arg-type]

    def image_feeds(self, params: "ModelFields", checkpoint: "Checkpoint", images: list[Any]) -> list[dict[str, Any]]:
        from ..hf_onnx.model import image_inputs

        pixels = (params.inputs or {}).get("pixel_values")
        if pixels is None or len(pixels.shape) != 4:
            raise CheckpointError(f"{params.model_class}: images go into a 'pixel_values' input of shape [batch, "
                                  f"channels, height, width], and it takes {', '.join(params.inputs or {})}")
        fixed = params.model_copy(update={"inputs": {name: spec.model_copy(update={"shape": spec.at("shape")})
                                                     for name, spec in (params.inputs or {}).items()}})
        samples = image_inputs(fixed, checkpoint, images)  # type: ignore[arg-type]
        return [{name: tensor.numpy() for name, tensor in zip(params.inputs or {}, sample)} for sample in samples]


class TowerFamily(Family):
    """The Qwen3.5 vision tower at a fixed image size."""

    name = "qwen3_5_vision_tower"
    default_outputs = ("embeds",)

    def check(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        from ..qwen3_5_tower.params import check_vision_config, tower_geometry

        if params.image_size is None:
            raise ParameterError("the Qwen3.5 tower (model_class: Qwen3_5VisionModel) needs image_size", key="image_size")
        if params.inputs is not None:
            raise ParameterError("the Qwen3.5 tower's input follows from image_size (its patches): leave inputs out",
                                 key="inputs")
        if self.outputs(params) != ["embeds"]:
            raise ParameterError("the Qwen3.5 tower has one output, embeds (its merged tokens)", key="outputs")
        if params.submodule is not None:
            raise ParameterError("the Qwen3.5 tower is exported whole: leave submodule out", key="submodule")
        vision = check_vision_config(checkpoint)
        try:
            tower_geometry(vision, params.image_size)
        except ParameterError as error:
            raise ParameterError(f"{error} (vision_config of {checkpoint.label})", key="image_size") from None

    def _geometry(self, params: "ModelFields", checkpoint: "Checkpoint") -> Any:
        from ..qwen3_5_tower.params import tower_geometry

        assert params.image_size is not None
        return tower_geometry(checkpoint.config_section("vision_config"), params.image_size)

    def selection(self, params: "ModelFields", checkpoint: "Checkpoint") -> TensorSelection:
        from ..qwen3_5_tower.params import VISUAL_PREFIX

        files = (PREPROCESSOR_FILE,) if checkpoint.has_file(PREPROCESSOR_FILE) else ()
        return TensorSelection(prefixes=(VISUAL_PREFIX,), config_key="vision_config", files=files)

    def inputs(self, params: "ModelFields", checkpoint: "Checkpoint") -> list[TensorSpec]:
        geometry = self._geometry(params, checkpoint)
        return [TensorSpec("patches", (geometry.patches, geometry.patch_dim), params.dtype)]

    def module(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        import torch

        from ..qwen3_5_tower.model import fixed_shape_tower_class, load_tower

        tower = load_tower(checkpoint, torch.float32, params.attn_implementation or "sdpa")
        # The patch embedding is a Conv3d whose kernel is its stride is the whole patch: on the
        # flattened patches it is one matrix product, the same numbers (a 5-D convolution is
        # what ExecuTorch's portable kernels and XNNPACK lack).
        tower.patch_embed = _linear_patch_embedding(tower.patch_embed)
        wrapper = fixed_shape_tower_class()(tower, self._geometry(params, checkpoint)).eval()

        class Outputs(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, patches: Any) -> tuple[Any, ...]:
                return (self.inner(patches),)

        return Outputs(wrapper).eval()

    def reference(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        """``Qwen3_5VisionModel.forward(patches, grid_thw).pooler_output`` itself, in float32."""
        import torch

        from ..qwen3_5_tower.model import load_tower

        tower = load_tower(checkpoint, torch.float32, params.attn_implementation or "sdpa")
        grid = torch.tensor([self._geometry(params, checkpoint).grid_thw], dtype=torch.long)

        class Forward(torch.nn.Module):
            def __init__(self, inner: Any) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, patches: Any) -> tuple[Any, ...]:
                return (self.inner(patches, grid).pooler_output,)

        return Forward(tower).eval()

    def examples(self, params: "ModelFields", checkpoint: "Checkpoint", shapes: dict[str, list[int]], count: int,
                 seed: int) -> list[tuple[Any, ...]]:
        from ..qwen3_5_tower.model import sample_patches

        return [(patches,) for patches in sample_patches(self._geometry(params, checkpoint), count, seed)]

    def image_feeds(self, params: "ModelFields", checkpoint: "Checkpoint", images: list[Any]) -> list[dict[str, Any]]:
        from ..qwen3_5_tower.images import image_patches, patch_preprocessing

        geometry = asdict(self._geometry(params, checkpoint))
        preprocessing = patch_preprocessing(checkpoint)
        return [{"patches": image_patches(preprocessing, image, geometry).astype(params.dtype)} for image in images]


TRANSFORMERS = TransformersFamily()
BUILT_IN: dict[str, Family] = {"Qwen3_5VisionModel": TowerFamily()}


def plugin_family(model_class: str) -> metadata.EntryPoint | None:
    """The entry point of the group ``edgebuild.models`` that claims ``model_class``."""
    return next((point for point in metadata.entry_points(group=MODELS_GROUP) if point.name == model_class), None)


def family_of(params: "ModelFields") -> Family:
    """The family a model description names: a built-in one, another package's, else transformers."""
    if params.model_class in BUILT_IN:
        return BUILT_IN[params.model_class]
    point = plugin_family(params.model_class)
    if point is not None:
        try:
            return point.load()
        except Exception as error:  # a plugin's import raises what its code does
            raise ParameterError(f"model_class: the model family {point.value!r} ({MODELS_GROUP}) does not load: "
                                 f"{type(error).__name__}: {error}", key="model_class") from None
    return TRANSFORMERS


def _linear_patch_embedding(embedding: Any) -> Any:
    """``Qwen3_5VisionPatchEmbed`` as a linear layer: the convolution's weight flattened in the
    order its ``view`` of the patches takes them (a leaf tensor of its own, as a program's
    parameters must be)."""
    import torch

    weight = embedding.proj.weight
    linear = torch.nn.Linear(weight[0].numel(), weight.shape[0], bias=embedding.proj.bias is not None,
                             dtype=weight.dtype, device="meta")
    linear.weight = torch.nn.Parameter(weight.detach().reshape(weight.shape[0], -1).clone(), requires_grad=False)
    if embedding.proj.bias is not None:
        linear.bias = torch.nn.Parameter(embedding.proj.bias.detach().clone(), requires_grad=False)

    class LinearPatchEmbed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = linear

        def forward(self, hidden_states: Any) -> Any:
            return self.proj(hidden_states.to(dtype=self.proj.weight.dtype))

    return LinearPatchEmbed()
