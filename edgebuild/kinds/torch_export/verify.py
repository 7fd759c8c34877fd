"""Judging the exported program: its module against the model's own forward in float32,
per output, on seeded random inputs (at the smallest and largest size of every dynamic
axis) and the held-out images.

It is the root of every target's chain: the model's forward is ``float_model``, the
reference each ExecuTorch program, LiteRT model and OpenVINO IR made from it is judged
against (``vs_float.*``).
"""

from __future__ import annotations

from typing import Any

from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.models.families import family_of
from edgebuild.models.held_out import held_out_feeds
from edgebuild.plugin import Check, Inputs, Runner, TensorSpec, Verification, VerifyContext, expand_inputs
from edgebuild.targets.formats import PROGRAM_FILE
from edgebuild.targets.program import input_specs, load_program, program_info

from .params import TorchExportParams


def verify(context: VerifyContext[TorchExportParams]) -> Verification:
    import torch

    params = context.params
    info = program_info(context.out_dir)
    family = family_of(params)
    outputs = family.outputs(params)
    program = load_program(context.out_dir / PROGRAM_FILE).module()
    reference = family.reference(params, context.checkpoint)
    samples, described = sample_inputs(context)
    comparisons: dict[str, list[dict[str, Any]]] = {name: [] for name in outputs}
    with torch.no_grad():
        for sample in samples:
            expected = reference(*(tensor.float() if tensor.is_floating_point() else tensor for tensor in sample))
            actual = program(*sample)
            for name, want, got in zip(outputs, expected, actual):
                comparisons[name].append(agreement(want.float()[None], got.float()[None]))
    checks: list[Check] = []
    measured = {}
    note = f"the program's module vs {params.model_class}.forward (float32), {described}"
    for name in outputs:
        measured[name] = worst_agreement(comparisons[name])
        checks += output_checks(name, measured[name], params.limits(name), note)
    return Verification(checks=checks, metrics={"outputs": measured, "inputs": described, "export": info})


def sample_inputs(context: VerifyContext[TorchExportParams]) -> tuple[list[tuple[Any, ...]], str]:
    """Seeded random inputs at the smallest and the largest size of every dynamic axis (the
    given shapes when none is), and the held-out images; what they are in words."""
    import torch

    params = context.params
    family = family_of(params)
    sizes = ("smallest", "largest") if params.dynamic else ("shape",)
    samples: list[tuple[Any, ...]] = []
    for size in sizes:
        shapes = {name: spec.at(size) for name, spec in (params.inputs or {}).items()}
        samples += family.examples(params, context.checkpoint, shapes, params.verify.samples, params.verify.seed)
    described = f"{params.verify.samples} random inputs" + (" at the smallest and at the largest dynamic sizes"
                                                            if params.dynamic else "")
    # The program's own held-out inputs (a root: its chain is itself), made once per judgement.
    held = context.held_out()
    if held is not None:
        samples += [tuple(torch.from_numpy(feed[spec.name]) for spec in family.inputs(params, context.checkpoint))
                    for feed in held.feeds]
        described += f" and {held.description}"
    dtype = getattr(torch, params.dtype)
    return [tuple(tensor.to(dtype) if tensor.is_floating_point() else tensor for tensor in sample)
            for sample in samples], described


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def float_model(context: VerifyContext[TorchExportParams]) -> Runner:
    """The model's own forward in float32: the reference of every target made from this program."""
    import transformers

    from edgebuild.targets.runners import torch_runner

    params = context.params
    family = family_of(params)
    return torch_runner(family.reference(params, context.checkpoint), input_specs(program_info(context.out_dir)),
                        family.outputs(params), f"transformers {transformers.__version__} {params.model_class}"
                        f"{f'.{params.submodule}' if params.submodule else ''}.forward (float32)")


def runner(context: VerifyContext[TorchExportParams]) -> Runner:
    """The exported program's module, in PyTorch."""
    import torch

    from edgebuild.targets.runners import torch_runner

    params = context.params
    module = load_program(context.out_dir / PROGRAM_FILE).module()
    return torch_runner(module, input_specs(program_info(context.out_dir)), family_of(params).outputs(params),
                        f"torch {torch.__version__} ExportedProgram.module()")


def evaluation_inputs(context: VerifyContext[TorchExportParams]) -> Inputs | None:
    """The held-out images, tensors and texts, as the program takes them (``None`` without
    any): what the program and every target lowered from it are judged on."""
    params = context.params
    feeds, said = [], []
    if params.held_out.images:
        images = expand_inputs(params.held_out.images, context.input_root, "held_out.images")
        feeds += family_of(params).image_feeds(params, context.checkpoint, images)
        said.append(f"{len(feeds)} batches of held-out images")
    if params.held_out.tensors or params.held_out.texts:
        # At the shapes the program was exported at.
        specs = [TensorSpec(spec["name"], tuple(spec["shape"]), spec["dtype"])
                 for spec in program_info(context.out_dir)["inputs"]]
        more, told = held_out_feeds(params.held_out, context.input_root, context.checkpoint, specs)
        feeds += more
        said += told
    return Inputs(feeds, " and ".join(said)) if feeds else None


def image_feeds(context: VerifyContext[TorchExportParams], images: list[Any]) -> list[dict[str, Any]]:
    """Images through the checkpoint's own image processor, as the program takes them."""
    params = context.params
    return family_of(params).image_feeds(params, context.checkpoint, images)
