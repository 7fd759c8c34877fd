"""Every stored tensor against the checkpoint's, after the same cast: same names, shapes
and values (to ``verify.max_abs``)."""

from __future__ import annotations

from edgebuild.plugin import Check, Verification, VerifyContext

from . import WEIGHTS_FILE, SubsetParams


def verify(context: VerifyContext[SubsetParams]) -> Verification:
    import torch
    from safetensors.torch import load_file

    params = context.params
    checkpoint = context.checkpoint
    expected = checkpoint.load(checkpoint.select(tuple(params.prefixes)))
    stored = load_file(str(context.out_dir / WEIGHTS_FILE))
    names = {name.removeprefix(params.strip_prefix): name for name in expected}
    worst = 0.0
    for short, name in names.items():
        if short not in stored or stored[short].shape != expected[name].shape:
            continue
        reference = expected[name]
        if params.dtype != "keep" and reference.is_floating_point():
            reference = reference.to(getattr(torch, params.dtype))
        worst = max(worst, (stored[short].double() - reference.double()).abs().max().item() if reference.numel() else 0.0)
    present = sum(1 for short, name in names.items() if short in stored and stored[short].shape == expected[name].shape)
    return Verification(
        checks=[
            Check.measure("tensors", present, "==", len(names), f"of {len(names)} selected, stored with their shapes"),
            Check.measure("extra_tensors", len(set(stored) - set(names)), "==", 0),
            Check.measure("max_abs", worst, "<=", params.verify.max_abs, "stored vs the checkpoint, after the cast"),
        ],
        metrics={"tensors": len(stored)},
    )
