"""Judging one built artifact: the outputs still at their recorded digests, then
the kind's own checks, into one report (written, never raised from here).

This module and the kind's verify module are the code a verification
fingerprint covers: editing either re-verifies, and rebuilds nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from edgebuild.errors import EdgebuildError
from edgebuild.core.kind import VerifyContext
from edgebuild.core.record import read_record
from edgebuild.core.report import Check, Report

if TYPE_CHECKING:
    from edgebuild.core.project import Project


def judge(project: "Project", name: str, log: Callable[[str], None]) -> Report:
    """Run every check on ``build/<name>/``; write and return the report."""
    record = project.record(name)
    directory = project.layout.artifact_dir(name)
    built = read_record(directory)
    if built is None or built.fingerprint != record.fingerprint:
        raise EdgebuildError(f"{name}: build/{name} is not the current build; run `doit build {name}` first")
    params = project.manifest.artifacts[name]
    kind = project.kind(name)
    changed = built.changed_outputs(directory)
    checks = [
        Check.measure(
            "outputs_intact",
            len(built.outputs) - len(changed),
            "==",
            len(built.outputs),
            f"changed since build: {', '.join(changed)}" if changed else "every output matches its recorded digest",
        )
    ]
    context = VerifyContext(**project.kind_inputs(name), out_dir=directory, build_info=built.build_info, log=log)
    started = time.perf_counter()
    verification = kind.verify(context)
    checks.extend(verification.checks)
    report = Report(
        artifact=name,
        kind=kind.name,
        fingerprint=record.fingerprint,
        checks=checks,
        metrics=verification.metrics | {"verify_seconds": time.perf_counter() - started},
        build=built.build_info,
        extra={"verify_fingerprint": project.verify_fingerprint(name), "verify": params.verify_parameters()},
    )
    report.write(directory)
    return report
