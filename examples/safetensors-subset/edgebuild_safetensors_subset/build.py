"""Copy the selected tensors into one SafeTensors file, in name order, cast as asked."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.plugin import BuildContext, Phases

from . import INFO_FILE, WEIGHTS_FILE, SubsetParams


def build(context: BuildContext[SubsetParams]) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file

    params = context.params
    phases = Phases()
    checkpoint = context.checkpoint
    with phases.time("load"):
        tensors = checkpoint.load(checkpoint.select(tuple(params.prefixes)))
    stored = {}
    for name in sorted(tensors):
        tensor = tensors[name]
        if params.dtype != "keep" and tensor.is_floating_point():
            tensor = tensor.to(getattr(torch, params.dtype))
        stored[name.removeprefix(params.strip_prefix)] = tensor.contiguous()
    with phases.time("save"):
        # Metadata in a fixed order: the same bytes on every rebuild.
        save_file(stored, str(context.out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    info = {"tensors": len(stored), "dtype": params.dtype, "bytes": sum(value.numel() * value.element_size() for value in stored.values())}
    (context.out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    context.log(f"{len(stored)} tensors, {info['bytes'] / 2**20:.1f} MiB")
    return info | {"timings": phases.seconds}
