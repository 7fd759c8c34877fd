"""edgebuild from Python, without a doit process: open a project from its manifest,
build, verify and ask the status of its artifacts, read their reports as typed data,
and ask what changed since a commit or a publish (``project.diff(against="main")``).

    import edgebuild

    project = edgebuild.open_project("artifacts.yaml")
    result = project.verify(["tower_448_fp32"])      # builds what is stale first
    if not result.ok:
        print(result.summary)                         # verify: 0 passed, 1 failed (...), 0 not run
    report = project.report("tower_448_fp32")
    print(report.passed, [(check.name, check.value, check.limit) for check in report.checks])

The same rules as the doit commands, through the same scheduler
(``edgebuild/run/scheduler.py``): only what is stale is built (through the store and
the remote cache), exports and verifications run in worker processes of their own,
a failed verification fails, the lock file records what is built. A project reads
its manifest, checkpoints and inputs once: open it again after changing them.

Settings are per project: ``open_project(path, remote_cache="s3://bucket/cache",
remote_readonly=True)`` (any field of :class:`~edgebuild.core.config.Settings`)
overrides what the environment says, for this project only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.report import Check, report_passed
from edgebuild.errors import EdgebuildError, VerificationFailed
from edgebuild.run.state import ArtifactState

if TYPE_CHECKING:
    from edgebuild.run.diff import Diff

Log = Callable[[str], None]
# What ``doit status`` says about one artifact (``edgebuild/run/state.py``).
ArtifactStatus = ArtifactState


@dataclass(frozen=True)
class VerificationReport:
    """``build/<artifact>/report.json``, typed."""

    artifact: str
    kind: str
    # The build that was verified.
    fingerprint: str
    passed: bool
    checks: tuple[Check, ...]
    metrics: dict[str, Any]
    # What the build recorded about itself (export details; timings).
    build: dict[str, Any]
    # The thresholds used, and the fingerprint of build + thresholds + judging code.
    thresholds: dict[str, Any]
    verify_fingerprint: str | None
    # The verdicts of the artifacts it is made from when it was judged (nearest first).
    chain: tuple[dict[str, Any], ...] = ()
    # A dataset gate's set and intervals: {name, digest, n, metrics: {NAME: {mean, ci95}}}.
    dataset: dict[str, Any] | None = None
    # Coverage certificates by target: {target: {tool, tool_version, assumption, nodes_total,
    # nodes_taken, partitions, fraction, fallbacks: [{node, op_type, module}]}}.
    coverage: dict[str, Any] = field(default_factory=dict)

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.passed)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "VerificationReport":
        return cls(
            artifact=data["artifact"],
            kind=data["kind"],
            fingerprint=data["fingerprint"],
            # Re-derived from the checks' values and limits, never taken as written.
            passed=report_passed(data),
            checks=tuple(Check.from_json(check) for check in data["checks"]),
            metrics=data.get("metrics", {}),
            build=data.get("build", {}),
            thresholds=data.get("verify", {}),
            verify_fingerprint=data.get("verify_fingerprint"),
            chain=tuple(data.get("chain", ())),
            dataset=data.get("dataset"),
            coverage=data.get("coverage", {}),
        )


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of :meth:`Project.verify`: each artifact passed, failed (its build or
    its verification), or was not run (an artifact it depends on failed)."""

    passed: tuple[str, ...]
    failed: dict[str, str]
    not_run: tuple[str, ...]
    reports: dict[str, VerificationReport] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_run

    @property
    def summary(self) -> str:
        """The line ``doit verify`` ends with."""
        from edgebuild.run.scheduler import verification_summary

        return verification_summary({"passed": list(self.passed), "failed": list(self.failed),
                                     "not run": list(self.not_run)})


class Project:
    """The artifacts of one manifest. Outputs go to ``build/`` beside the manifest,
    caches to ``cache/``, the lock file to ``<manifest stem>.lock``."""

    def __init__(self, manifest: str | os.PathLike[str] | None = None, **settings: Any) -> None:
        from edgebuild.core.config import Settings
        from edgebuild.run.workspace import Workspace

        chosen = Settings.from_environ().replace(**settings)
        self._workspace = Workspace.open(os.path.abspath(_manifest_path(manifest, chosen)), settings=chosen)

    @property
    def manifest_path(self) -> Path:
        return self._workspace.manifest.path

    @property
    def artifacts(self) -> list[str]:
        """Every artifact, dependencies first."""
        return [artifact.name for artifact in self._workspace.order()]

    def artifact_dir(self, name: str) -> Path:
        return self._handles([name])[0].directory

    def fingerprint(self, name: str) -> str:
        return self._handles([name])[0].fingerprint

    def build(self, names: list[str] | None = None, log: Log | None = None) -> dict[str, str]:
        """Make ``names`` (all when ``None``) and what they depend on current, dependencies
        first; return artifact -> fingerprint. Raises the first failure's
        :class:`~edgebuild.errors.EdgebuildError` (what it had built stays built)."""
        from edgebuild.run.scheduler import run

        workspace = self._workspace
        chosen = self._handles(names)
        try:
            outcomes = run(workspace, chosen, verify_them=False, fail_fast=True, log=_log(log))
        finally:
            self._lock(chosen)
        if outcomes.exceptions:
            raise next(iter(outcomes.exceptions.values()))
        return {artifact.name: artifact.fingerprint for artifact in workspace.order(chosen)}

    def verify(self, names: list[str] | None = None, log: Log | None = None) -> VerifyResult:
        """Build what is stale, then verify ``names`` (all when ``None``), going on after
        a failure. An artifact already verified against its current thresholds is not
        verified again."""
        from edgebuild.run.scheduler import run

        chosen = self._handles(names)
        try:
            outcomes = run(self._workspace, chosen, verify_them=True, log=_log(log))
        finally:
            self._lock(chosen)
        sorted_names = outcomes.verification([artifact.name for artifact in chosen])
        errors = outcomes.errors()
        failed = {}
        for artifact in self._workspace.order(chosen):
            for task in (artifact.name, f"verify:{artifact.name}"):
                if task in errors and artifact.name not in failed:
                    failed[artifact.name] = errors[task]
        reports = {artifact.name: report for artifact in chosen if (report := self.report(artifact.name)) is not None}
        return VerifyResult(
            passed=tuple(sorted_names["passed"]),
            failed=failed,
            not_run=tuple(sorted_names["not run"]),
            reports=reports,
        )

    def status(self, names: list[str] | None = None) -> list[ArtifactStatus]:
        """Up to date, stale (with reasons), missing or error, per artifact; builds nothing."""
        from edgebuild.run.state import statuses

        states = statuses(self._workspace, self._handles(names))
        self._workspace.save_caches()
        return states

    def report(self, name: str) -> VerificationReport | None:
        """The last verification report of ``name``; ``None`` if it was never verified.
        It may be of an older build: compare its ``fingerprint`` with :meth:`fingerprint`."""
        from edgebuild.core.report import read_report

        data = read_report(self.artifact_dir(name))
        return VerificationReport.from_json(data) if data is not None else None

    def diff(self, names: list[str] | None = None, against: str = "HEAD") -> "Diff":
        """What changed in each artifact since ``against`` -- a git revision whose committed
        lock file names the old fingerprints, or a published destination -- as typed data
        (:class:`~edgebuild.run.diff.Diff`: per artifact the fingerprint's changes in words,
        the outputs, each check old -> new); builds nothing. ``DiffError`` when ``against``
        cannot be read."""
        from edgebuild.run.diff import diff

        result = diff(self._workspace, self._handles(names) if names else None, against)
        self._workspace.save_caches()
        return result

    def _lock(self, chosen: list[Any]) -> None:
        from edgebuild.run.lockfile import update_lock

        update_lock(self._workspace, self._workspace.order(chosen))
        self._workspace.save_caches()

    def _handles(self, names: list[str] | None) -> list[Any]:
        workspace = self._workspace
        if names is None:
            return workspace.order()
        if isinstance(names, str):
            raise TypeError("pass a list of artifact names, not one string")
        known = [artifact.name for artifact in workspace.order()]
        for name in names:
            if name not in workspace.manifest.artifacts:
                import difflib

                match = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {match[0]!r}?)" if match else ""
                raise KeyError(f"unknown artifact {name!r}{hint}")
        return [workspace.artifact(name) for name in names]


def open_project(manifest: str | os.PathLike[str] | None = None, **settings: Any) -> Project:
    """The project of ``manifest`` (default: ``EDGEBUILD_MANIFEST``, else ``artifacts.yaml``
    in the cwd), with ``settings`` (fields of :class:`~edgebuild.core.config.Settings`:
    ``remote_cache``, ``remote_readonly``, ...) over the environment's. Raises
    :class:`~edgebuild.errors.ManifestError` for a bad manifest."""
    return Project(manifest, **settings)


def _manifest_path(manifest: str | os.PathLike[str] | None, settings: Any) -> Path:
    from edgebuild.core.manifest import manifest_path

    return manifest_path(manifest or settings.manifest)


def fetch(name: str, source: str, to: str | os.PathLike[str], fingerprint: str | None = None, commit: str | None = None,
          trusted_keys: list[str] | None = None, log: Log | None = None) -> Path:
    """Download the published build of ``name`` from ``source`` (where ``doit publish --to``
    put it) into the directory ``to``: the latest one, or the one with ``fingerprint``, or
    the newest published from ``commit``. Every byte is checked against its
    ``SHA256SUMS`` and the release's signature against ``trusted_keys`` (public key paths;
    default ``EDGEBUILD_TRUSTED_KEYS``) before anything is written; raises
    :class:`~edgebuild.errors.FetchError` otherwise. Returns ``to``."""
    from edgebuild.run.fetch import fetch as fetch_artifact

    return fetch_artifact(name, source, to, fingerprint=fingerprint, commit=commit, trusted_keys=trusted_keys,
                          log=log or (lambda message: None))


def _log(log: Log | None) -> Callable[[str, str], None] | None:
    if log is None:
        return None
    return lambda name, message: log(f"[{name}] {message}")


__all__ = ["ArtifactStatus", "EdgebuildError", "Project", "VerificationFailed", "VerificationReport", "VerifyResult",
           "fetch", "open_project"]
