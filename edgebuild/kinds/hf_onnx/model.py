"""The model as transformers defines it, loaded strictly, behind a module whose forward
takes the graph's inputs in order and returns the chosen outputs; and its inputs: seeded
random ones, and held-out images through the checkpoint's own image processor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgebuild.ml.hf import load_pretrained, transformers_class
from edgebuild.plugin import ExportError

from .params import HfOnnxParams

if TYPE_CHECKING:
    from edgebuild.core.checkpoint import Checkpoint
    from edgebuild.core.model_inputs import DynamicInput


def load_model(params: HfOnnxParams, checkpoint: "Checkpoint") -> Any:
    """``params.model_class`` from the checkpoint, float32, strictly; with
    ``tensor_prefixes``, an error if the class reads a tensor outside them."""
    model_class = transformers_class(params.model_class, "model_class")
    options = {"attn_implementation": params.attn_implementation} if params.attn_implementation else {}
    model, used = load_pretrained(model_class, checkpoint, **options)
    if params.tensor_prefixes is not None:
        outside = sorted(name for name in used if not name.startswith(tuple(params.tensor_prefixes)))
        if outside:
            shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
            raise ExportError(
                f"{params.model_class} reads {shown} from {checkpoint.label}, outside tensor_prefixes "
                f"{params.tensor_prefixes}: add its prefix, or the fingerprint would not cover it"
            )
    return model


def outputs_module(model: Any, params: HfOnnxParams) -> Any:
    """A module whose forward takes the inputs in the manifest's order (positionally: the
    graph's inputs) and returns ``params.outputs`` of the model's output, as a tuple."""
    return named_outputs_module(model, list(params.inputs), list(params.outputs))


def named_outputs_module(model: Any, names: list[str], outputs: list[str]) -> Any:
    """``model`` called with ``names`` as keywords, from positional tensors, returning the
    fields ``outputs`` of its output as a tuple."""
    import torch

    class Outputs(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *tensors: Any) -> tuple[Any, ...]:
            result = self.inner(**dict(zip(names, tensors)))
            return tuple(result[name] for name in outputs)

    return Outputs(model).eval()


def check_outputs(model: Any, params: HfOnnxParams, example: tuple[Any, ...]) -> dict[str, list[int]]:
    """Run the model once: every output named exists (else one line naming what it has);
    return each output's shape."""
    import torch

    try:
        with torch.no_grad():
            result = model(**dict(zip(params.inputs, example)))
    except (TypeError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())
        raise ExportError(f"{params.model_class}.forward refused the inputs {list(params.inputs)}: {reason}") from None
    available = [key for key in result.keys() if result[key] is not None]
    missing = [name for name in params.outputs if name not in available]
    if missing:
        raise ExportError(
            f"outputs: {params.model_class} returns no {missing[0]!r}; it returns {', '.join(available)}"
        )
    return {name: list(result[name].shape) for name in params.outputs}


def dynamic_shapes(inputs: "dict[str, DynamicInput] | None") -> tuple[Any, ...] | None:
    """``torch.export``'s (and so torch's ONNX exporter's) dynamic shapes for the module's
    positional inputs (:func:`named_outputs_module`: one argument, ``*tensors``): a ``Dim``
    per dynamic axis, between its sizes; ``None`` when every shape is fixed."""
    from torch.export import Dim

    if not any(spec.dynamic for spec in (inputs or {}).values()):
        return None
    assert inputs is not None
    return (tuple({axis: Dim(f"{name}_{axis}", min=low, max=high) for axis, (low, high) in spec.dynamic.items()}
                  or None for name, spec in inputs.items()),)


def at_each_size(params: HfOnnxParams) -> list[HfOnnxParams]:
    """The parameters at each size a graph is checked at: every dynamic axis at its
    smallest, then at its largest size; the parameters alone when nothing is dynamic."""
    if not params.dynamic:
        return [params]
    return [params.model_copy(update={"inputs": {name: spec.model_copy(update={"shape": spec.at(size)})
                                                 for name, spec in params.inputs.items()}})
            for size in ("smallest", "largest")]


def random_inputs(params: HfOnnxParams, config: Any, count: int, seed: int) -> list[tuple[Any, ...]]:
    """``count`` tuples of inputs at the fixed shapes, the same for the same seed: floating
    inputs from N(0, 1); ids uniform below the vocabulary; masks all ones; other
    integers zero."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    vocabulary = int(getattr(config, "vocab_size", None) or 2)
    samples = []
    for _ in range(count):
        sample = []
        for name, spec in params.inputs.items():
            dtype = getattr(torch, params.input_dtype(name))
            if dtype.is_floating_point:
                value = torch.randn(spec.shape, generator=generator).to(dtype)
            elif dtype == torch.bool or name.endswith("_mask"):
                value = torch.ones(spec.shape, dtype=dtype)
            elif name.endswith("_ids") and "token_type" not in name:
                value = torch.randint(0, max(vocabulary, 1), spec.shape, generator=generator, dtype=dtype)
            else:
                value = torch.zeros(spec.shape, dtype=dtype)
            sample.append(value)
        samples.append(tuple(sample))
    return samples


def image_inputs(params: HfOnnxParams, checkpoint: "Checkpoint", images: list[Any]) -> list[tuple[Any, ...]]:
    """Images (paths, or RGB images read) as ``pixel_values`` batches of the graph's fixed
    shape (through the checkpoint's own image processor); the other inputs as
    :func:`random_inputs` gives them."""
    import torch

    from edgebuild.ml.hf import pixel_batches

    batches = pixel_batches(checkpoint, images, params.inputs["pixel_values"].shape)
    dtype = getattr(torch, params.input_dtype("pixel_values"))
    others = random_inputs(params, checkpoint_config(checkpoint), len(batches), 0)
    position = list(params.inputs).index("pixel_values")
    samples = []
    for pixels, other in zip(batches, others):
        sample = list(other)
        sample[position] = pixels.to(dtype)
        samples.append(tuple(sample))
    return samples


def checkpoint_config(checkpoint: "Checkpoint") -> Any:
    """The checkpoint's ``config.json`` as an object with attributes (vocab_size, ...)."""
    from types import SimpleNamespace

    return SimpleNamespace(**checkpoint.config)
