"""Judging a target: how far its check got here (``level`` against ``require_level``) and,
run, each output against the ``torch.export`` program it was lowered from, on the same
inputs at every size of the program's dynamic axes. Verification only (the targets'
builds do not import it)."""

from __future__ import annotations

from typing import Any

from edgebuild.core.kind import Verification, VerifyContext
from edgebuild.core.report import Check
from edgebuild.core.runner import Runner, with_held_out
from edgebuild.core.thresholds import OutputLimits
from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.targets.params import LEVELS, Level, TargetParams
from edgebuild.targets.program import (input_specs, load_program, output_names, program_feeds, program_info,
                                      program_path)


def judge_target(context: VerifyContext[TargetParams], runner: Runner | None, level: Level, reason: str,
                 defaults: OutputLimits, metrics: dict[str, Any]) -> Verification:
    """The target's checks: how far it got here (``level`` against ``require_level``) and,
    run (``runner``), each output against the program it was lowered from (its source)
    on the same inputs."""
    import numpy
    import torch

    source = context.source
    verify = context.params.verify
    checks = [Check.measure("level", level, ">=", verify.require_level, reason, order=LEVELS)]
    metrics = metrics | {"level": level}
    if runner is None:
        return Verification(checks=checks, metrics=metrics)
    info = program_info(source)
    inputs = with_held_out(program_feeds(info, verify.samples, verify.seed), context.held_out(), input_specs(info))
    program = load_program(program_path(source)).module()
    names = output_names(info)
    comparisons: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with torch.no_grad():
        for feed in inputs.feeds:
            expected = program(*(torch.from_numpy(numpy.ascontiguousarray(feed[spec["name"]])) for spec in info["inputs"]))
            found = runner.run_one(feed)
            for name, want in zip(names, expected):
                comparisons[name].append(agreement(want.float()[None], torch.from_numpy(
                    numpy.asarray(found[name], dtype=numpy.float32))[None]))
    note = f"{runner.description} vs the torch.export program, {inputs.description}"
    measured = {}
    for name in names:
        measured[name] = worst_agreement(comparisons[name])
        checks += output_checks(name, measured[name], verify.for_output(name, defaults), note)
    return Verification(checks=checks, metrics=metrics | {"outputs": measured, "inputs": inputs.description})
