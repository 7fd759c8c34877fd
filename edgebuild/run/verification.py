"""Judging one built artifact: the outputs still at their recorded digests, then
the kind's own checks, then the checks along its chain and on data (``chain.py``:
against the float model at the root of its chain, and a dataset's gates), then the
coverage certificates of its targets and their gates (``coverage.py``), into one
report (written, never raised from here).

This module and the kind's verify module are the code a verification
fingerprint covers: editing either re-verifies, and rebuilds nothing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from edgebuild.core.kind import VerifyContext
from edgebuild.core.record import read_record
from edgebuild.core.report import Check, Report
from edgebuild.errors import EdgebuildError
from edgebuild.run.chain import judge_along_chain
from edgebuild.run.coverage import judge_coverage

if TYPE_CHECKING:
    # Annotations only: the judging code's digest must not hold the manifest's.
    from edgebuild.core.project import Artifact, BuildGraph


def judge(project: BuildGraph, artifact: Artifact, log: Callable[[str], None]) -> Report:
    """Run every check on ``build/<name>/``; write and return the report."""
    name = artifact.name
    record = artifact.record
    directory = artifact.directory
    built = read_record(directory)
    if built is None or built.fingerprint != record.fingerprint:
        raise EdgebuildError(f"{name}: build/{name} is not the current build; run `doit build {name}` first")
    kind = artifact.kind
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
    context = VerifyContext(
        **project.kind_inputs(artifact),
        out_dir=directory,
        build_info=built.build_info,
        source_params={source.name: source.params for source in artifact.sources},
        log=log,
    )
    started = time.perf_counter()
    verification = kind.verify(context)
    checks.extend(verification.checks)
    along = judge_along_chain(project, artifact, context, log)
    checks.extend(along.checks)
    coverage = judge_coverage(kind, artifact.params, directory, log)
    checks.extend(coverage.checks)
    report = Report(
        artifact=name,
        kind=kind.name,
        fingerprint=record.fingerprint,
        checks=checks,
        metrics=verification.metrics | along.metrics | {"verify_seconds": time.perf_counter() - started}
        | ({"coverage_not_computed": coverage.missing} if coverage.missing else {}),
        build=built.build_info,
        extra={"verify_fingerprint": artifact.verify_fingerprint, "verify": artifact.params.verify_parameters(),
               # Each part of the verification fingerprint, by digest: `doit status` names the one that moves.
               "verify_parts": project.verify_parts(artifact)}
        | along.extra
        | ({"coverage": coverage.certificates} if coverage.certificates else {}),
    )
    report.write(directory)
    return report
