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
from typing import TYPE_CHECKING, Callable, TypeVar

from edgebuild.core.kind import Verification, VerifyContext
from edgebuild.core.record import read_record
from edgebuild.core.report import Check, Report
from edgebuild.errors import EdgebuildError, NotRunnable
from edgebuild.run.chain import ChainVerdict, judge_along_chain, verify_context
from edgebuild.run.coverage import judge_coverage

T = TypeVar("T")

if TYPE_CHECKING:
    # Annotations only: the judging code's digest must not hold the manifest's.
    from edgebuild.core.project import Artifact, BuildGraph


def _ran(judgement: Callable[[], T], what: str, failing: Callable[[Check], T]) -> T:
    """``judgement()``; where its kind says the artifact cannot run here (:class:`NotRunnable`:
    an input the converted model cannot take, no runtime for it), one failed check
    ``verify.ran`` saying why, in one line, so that the report is written FAILED (never
    "not verified yet" again and again). Anything else is raised as it is: the user's input
    (one line, nothing written), or a bug in a kind's code (its traceback, for its author)."""
    try:
        return judgement()
    except NotRunnable as error:
        return failing(Check("verify.ran", False, True, "==", False, f"{what} could not run here: {error}"))


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
    # One context per member of the chain, shared by the kind's checks and the chain's.
    contexts: dict[str, VerifyContext] = {}
    context = verify_context(project, artifact, log, contexts)
    started = time.perf_counter()
    verification = _ran(lambda: kind.verify(context), f"the {kind.name} kind's checks",
                        lambda failed: Verification(checks=[failed]))
    checks.extend(verification.checks)
    along = _ran(lambda: judge_along_chain(project, artifact, contexts, log), "the checks along its chain",
                 lambda failed: ChainVerdict(checks=[failed]))
    checks.extend(along.checks)
    coverage = judge_coverage(kind, artifact.params, directory, log)
    checks.extend(coverage.checks)
    # Noise alone proves little (a model judged on N(0, 1) pixels): the headline says so.
    held = context.held_out()
    judged_on = {"held_out": held.description if held is not None else None,
                 "dataset": along.extra.get("dataset", {}).get("description")}
    report = Report(
        artifact=name,
        kind=kind.name,
        fingerprint=record.fingerprint,
        checks=checks,
        metrics=verification.metrics | along.metrics | {"verify_seconds": time.perf_counter() - started}
        | ({"coverage_not_computed": coverage.missing} if coverage.missing else {}),
        build=built.build_info,
        extra={"verify_fingerprint": artifact.verify_fingerprint, "verify": artifact.params.verify_parameters(),
               "judged_on": judged_on | {"random_only": not any(judged_on.values())},
               # Each part of the verification fingerprint, by digest: `doit status` names the one that moves.
               "verify_parts": project.verify_parts(artifact)}
        | along.extra
        | ({"coverage": coverage.certificates} if coverage.certificates else {}),
    )
    # Sealed in the build record as written (Report.write): an edit after is refused.
    report.write(directory)
    return report
