"""What a model family answers for a model description and its checkpoint: which part of
the checkpoint it reads, the module exported and the model's own forward (the float model
every target made from it is judged against), its inputs at their shapes, seeded
examples, and how an image becomes its inputs. A family from another package implements
this (``families.py`` finds it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebuild.core.kind import TensorSelection
from edgebuild.core.runner import TensorSpec
from edgebuild.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.models.fields import ModelFields


class Family:
    """What a model family answers for a model description ``params`` and its checkpoint."""

    name = "family"
    default_outputs: tuple[str, ...] = ()

    def check(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        """:class:`ParameterError` (with the key) for a description this family cannot build."""

    def check_deeply(self, params: "ModelFields", checkpoint: "Checkpoint") -> None:
        """:meth:`check`, with the model's code imported (``check --deep`` only)."""

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
