"""``doit divergence ARTIFACT [--depth N] [--json]``: where an artifact leaves float, module
by module along its chain (``edgebuild/run/divergence.py``); builds nothing."""

from __future__ import annotations

import json
import sys

from edgebuild.cli.common import JSON_OPTION, NamesAnywhere, WorkspaceCommand, fail, selected
from edgebuild.errors import EdgebuildError


class Divergence(NamesAnywhere, WorkspaceCommand):
    name = "divergence"
    doc_purpose = "say where an artifact leaves the float model, module by module along its chain"
    doc_usage = "ARTIFACT [--depth N] [--json]"
    doc_description = (
        "Runs every member of the artifact's chain (the float model at its root -- transformers' own "
        "forward -- then each artifact made from it, in its own runtime) on the chain's held-out inputs "
        "(else its seeded random ones) and compares the tensor at the end of each module with the float "
        "model's: cosine, relative L2 error and max abs against float, the error each step adds "
        "(vs_previous_rel_l2), and the onset: the first module where a step (export, quantization, "
        "compilation, conversion) makes an error, with its nodes. A runtime that shows no module's "
        "tensors is compared at its outputs. Writes build/ARTIFACT/divergence.json; kept in "
        "cache/divergence/ by the chain's fingerprints and the inputs, so a second run computes nothing. "
        "Exits 0 (information), 2 when the artifact or a member of its chain is not built, or its chain "
        "has no torch model at its root."
    )
    cmd_options = (
        {"name": "depth", "short": "", "long": "depth", "type": int, "default": 3,
         "help": "how deep in the module tree to compare, an index counting with its name: 1 the model's "
                 "top modules (encoder), 2 its blocks (encoder.layers.3), 3 their children (default)"},
        JSON_OPTION,
    )

    def run(self, workspace, params, args):  # noqa: D102
        from edgebuild.run.divergence import MAX_DEPTH, divergence, render

        names = selected(args, workspace) if args else []
        if len(names) != 1:
            fail(f"doit divergence takes one artifact, {len(names)} given; `doit list` shows them")
            return 2
        depth = params["depth"]
        if not 1 <= depth <= MAX_DEPTH:
            fail(f"--depth {depth}: expected 1 to {MAX_DEPTH}")
            return 2
        log = (lambda line: print(line, file=sys.stderr, flush=True)) if not params["as_json"] else (lambda line: None)
        try:
            result = divergence(workspace, workspace.artifact(names[0]), depth, log)
        except EdgebuildError as error:
            fail(str(error))
            return 2
        workspace.save_caches()
        print(json.dumps(result, indent=2, sort_keys=True) if params["as_json"] else "\n".join(render(result)))
        sys.stdout.flush()
        return 0
