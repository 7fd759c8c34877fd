"""Model families: what module a model description names, at which shapes, and how an
image becomes its inputs. The targets know nothing of them: they lower the program a
family's module exports to.

- ``transformers`` (every class but those another family claims): the class named by
  ``model_class``, loaded strictly with its own ``from_pretrained``; with ``submodule``,
  the module at that attribute path alone, with only its own inputs;
- ``qwen3_5_vision_tower`` (``model_class: Qwen3_5VisionModel``): transformers' tower at a
  fixed ``image_size`` through its fixed-shape wrapper (``qwen3_5/family.py``), its input
  the processor's ``patches``, its output the merged tokens, ``embeds``.

A family from another package is an entry point of the group ``edgebuild.models`` named
after the ``model_class`` it claims, pointing at an object with this module's
:class:`Family` methods; the artifact's build fingerprint follows its module's code.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

from edgebuild.core.kind import TensorSelection
from edgebuild.core.runner import TensorSpec
from edgebuild.errors import CheckpointError, ExportError, ParameterError
from edgebuild.models.family import Family
from edgebuild.models.inputs import read_tokenizer_files
from edgebuild.models.qwen3_5.family import TowerFamily

if TYPE_CHECKING:
    import torch

    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.models.fields import ModelFields

MODELS_GROUP = "edgebuild.models"
PREPROCESSOR_FILE = "preprocessor_config.json"


class TransformersFamily(Family):
    """Any transformers class, loaded strictly; optionally one of its modules alone."""

    name = "transformers"
    default_outputs = ("last_hidden_state",)

    def check(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        from edgebuild.models.hf import transformers_class

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

    def check_deeply(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        from edgebuild.models.hf import check_forward_inputs

        if not params.submodule:
            # A submodule's forward is known only once the model is made; the build says.
            check_forward_inputs(params.model_class, params.inputs or {})

    def selection(self, params: "ModelFields", checkpoint: "Checkpoint") -> TensorSelection:
        prefixes = tuple(params.tensor_prefixes) if params.tensor_prefixes is not None else ("",)
        files = ((PREPROCESSOR_FILE,) if params.held_out.images else ()) + read_tokenizer_files(params, checkpoint)
        return TensorSelection(prefixes=prefixes, config_key=None, files=files)

    def inputs(self, params: "ModelFields", checkpoint: "Checkpoint") -> list[TensorSpec]:
        assert params.inputs is not None
        return [TensorSpec(name, tuple(spec.at("largest")), params.input_dtype(name)) for name, spec in params.inputs.items()]

    def _model(self, params: "ModelFields", checkpoint: "Checkpoint") -> Any:
        from edgebuild.models.hf import load_model

        model = load_model(params, checkpoint)  # type: ignore[arg-type]
        for part in (params.submodule or "").split(".") if params.submodule else ():
            inner = getattr(model, part, None)
            if inner is None or not hasattr(inner, "forward"):
                raise ExportError(f"submodule: {params.model_class} has no module {params.submodule!r} "
                                  f"({part!r} is not one of its modules)")
            model = inner
        return model

    def module(self, params: "ModelFields", checkpoint: "Checkpoint") -> "torch.nn.Module":
        from edgebuild.models.hf import named_outputs_module

        return named_outputs_module(self._model(params, checkpoint), list(params.inputs or {}), self.outputs(params))

    def examples(self, params: "ModelFields", checkpoint: "Checkpoint", shapes: dict[str, list[int]], count: int,
                 seed: int) -> list[tuple[Any, ...]]:
        from edgebuild.models.hf import checkpoint_config, random_inputs

        sized = params.model_copy(update={"inputs": {name: spec.model_copy(update={"shape": shapes[name]})
                                                      for name, spec in (params.inputs or {}).items()}})
        return random_inputs(sized, checkpoint_config(checkpoint), count, seed)  # type: ignore[arg-type]

    def image_feeds(self, params: "ModelFields", checkpoint: "Checkpoint", images: list[Any]) -> list[dict[str, Any]]:
        from edgebuild.models.hf import image_inputs

        pixels = (params.inputs or {}).get("pixel_values")
        if pixels is None or len(pixels.shape) != 4:
            raise CheckpointError(f"{params.model_class}: images go into a 'pixel_values' input of shape [batch, "
                                  f"channels, height, width], and it takes {', '.join(params.inputs or {})}")
        fixed = params.model_copy(update={"inputs": {name: spec.model_copy(update={"shape": spec.at("shape")})
                                                     for name, spec in (params.inputs or {}).items()}})
        samples = image_inputs(fixed, checkpoint, images)  # type: ignore[arg-type]
        return [{name: tensor.numpy() for name, tensor in zip(params.inputs or {}, sample)} for sample in samples]


TRANSFORMERS = TransformersFamily()
# The families edgebuild brings, by the model class each claims.
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
