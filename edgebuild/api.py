"""edgebuild from Python, without a doit process: open a project from its manifest,
build, verify and ask the status of its artifacts, read their reports as typed data.

    import edgebuild

    project = edgebuild.open_project("artifacts.yaml")
    result = project.verify(["tower_448_fp32"])      # builds what is stale first
    if not result.ok:
        print(result.summary)                         # verify: 0 passed, 1 failed (...), 0 not run
    report = project.report("tower_448_fp32")
    print(report.passed, [(check.name, check.value, check.limit) for check in report.checks])

The same rules as the doit commands: only what is stale is built (through the
store and the remote cache), a failed verification fails, the lock file records
what is built. A project reads its manifest, checkpoints and inputs once: open it
again after changing them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from .errors import EdgebuildError, VerificationFailed
from edgebuild.core.report import Check

Log = Callable[[str], None]
State = Literal["up to date", "stale", "missing", "error"]


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

    @property
    def failed_checks(self) -> tuple[Check, ...]:
        return tuple(check for check in self.checks if not check.passed)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "VerificationReport":
        return cls(
            artifact=data["artifact"],
            kind=data["kind"],
            fingerprint=data["fingerprint"],
            passed=bool(data["passed"]),
            checks=tuple(Check(**check) for check in data["checks"]),
            metrics=data.get("metrics", {}),
            build=data.get("build", {}),
            thresholds=data.get("verify", {}),
            verify_fingerprint=data.get("verify_fingerprint"),
        )


@dataclass(frozen=True)
class ArtifactStatus:
    """What ``doit status`` says about one artifact."""

    artifact: str
    state: State
    fingerprint: str | None = None
    # Why it is stale, or what is wrong (state "error").
    reasons: tuple[str, ...] = ()
    # "verified", "not verified", "verification FAILED", "restorable from the store".
    note: str | None = None


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
        from edgebuild.cli.commands import verification_summary

        return verification_summary({"passed": list(self.passed), "failed": list(self.failed),
                                     "not run": list(self.not_run)})


class Project:
    """The artifacts of one manifest. Outputs go to ``build/`` beside the manifest,
    caches to ``cache/``, the lock file to ``<manifest stem>.lock``."""

    def __init__(self, manifest: str | os.PathLike[str] | None = None) -> None:
        from edgebuild.core.project import Project as ProjectState

        self._project = ProjectState.load(os.path.abspath(_manifest_path(manifest)))

    @property
    def manifest_path(self) -> Path:
        return self._project.manifest.path

    @property
    def artifacts(self) -> list[str]:
        """Every artifact, dependencies first."""
        return self._project.manifest.order()

    def artifact_dir(self, name: str) -> Path:
        self._known([name])
        return self._project.layout.artifact_dir(name)

    def fingerprint(self, name: str) -> str:
        self._known([name])
        return self._project.fingerprint(name)

    def build(self, names: list[str] | None = None, log: Log | None = None) -> dict[str, str]:
        """Make ``names`` (all when ``None``) and what they depend on current, dependencies
        first; return artifact -> fingerprint. Raises the first failure's
        :class:`~edgebuild.errors.EdgebuildError` (what it had built stays built)."""
        from edgebuild.run.builder import build_artifact
        from edgebuild.core.console import quieted
        from edgebuild.run.lockfile import update_lock

        selected = self._known(names)
        order = self._project.manifest.order(selected)
        built: dict[str, str] = {}
        try:
            with quieted():
                for name in order:
                    built[name] = build_artifact(self._project, name, _log(name, log)).fingerprint
        finally:
            update_lock(self._project, order)
            self._project.save_caches()
        return built

    def verify(self, names: list[str] | None = None, log: Log | None = None) -> VerifyResult:
        """Build what is stale, then verify ``names`` (all when ``None``), going on after
        a failure. An artifact already verified against its current thresholds is not
        verified again."""
        from edgebuild.run.builder import build_artifact, verify_artifact
        from edgebuild.core.console import quieted
        from edgebuild.run.lockfile import update_lock
        from edgebuild.core.record import VerificationState, verification_state

        project = self._project
        selected = self._known(names)
        order = project.manifest.order(selected)
        failed: dict[str, str] = {}
        not_run: list[str] = []
        passed: list[str] = []
        try:
            with quieted():
                for name in order:
                    if any(dependency in failed or dependency in not_run for dependency in project.manifest.dependencies(name)):
                        not_run.append(name)
                        continue
                    try:
                        build_artifact(project, name, _log(name, log))
                    except EdgebuildError as error:
                        failed[name] = str(error)
                for name in selected:
                    if name in failed or name in not_run:
                        continue
                    try:
                        if verification_state(project, name) is not VerificationState.VERIFIED or (
                            project.remote_cache is not None and not project.remote_cache.has_entry(project.fingerprint(name))
                        ):
                            verify_artifact(project, name, _log(name, log))
                        passed.append(name)
                    except EdgebuildError as error:
                        failed[name] = str(error)
        finally:
            update_lock(project, order)
            project.save_caches()
        reports = {name: report for name in selected if (report := self.report(name)) is not None}
        return VerifyResult(
            passed=tuple(passed),
            failed={name: failed[name] for name in order if name in failed},
            not_run=tuple(name for name in selected if name in not_run),
            reports=reports,
        )

    def status(self, names: list[str] | None = None) -> list[ArtifactStatus]:
        """Up to date, stale (with reasons), missing or error, per artifact; builds nothing."""
        from edgebuild.run.state import artifact_status

        states = [artifact_status(self._project, name) for name in self._known(names)]
        self._project.save_caches()
        return [
            ArtifactStatus(
                artifact=state["artifact"], state=state["state"], fingerprint=state.get("fingerprint"),
                reasons=tuple(state.get("reasons", ())), note=state.get("note"),
            )
            for state in states
        ]

    def report(self, name: str) -> VerificationReport | None:
        """The last verification report of ``name``; ``None`` if it was never verified.
        It may be of an older build: compare its ``fingerprint`` with :meth:`fingerprint`."""
        from edgebuild.core.report import read_report

        data = read_report(self.artifact_dir(name))
        return VerificationReport.from_json(data) if data is not None else None

    def _known(self, names: list[str] | None) -> list[str]:
        known = self._project.manifest.order()
        if names is None:
            return known
        if isinstance(names, str):
            raise TypeError("pass a list of artifact names, not one string")
        for name in names:
            if name not in self._project.manifest.artifacts:
                import difflib

                match = difflib.get_close_matches(name, known, n=1)
                hint = f" (did you mean {match[0]!r}?)" if match else ""
                raise KeyError(f"unknown artifact {name!r}{hint}")
        return list(names)


def open_project(manifest: str | os.PathLike[str] | None = None) -> Project:
    """The project of ``manifest`` (default: ``EDGEBUILD_MANIFEST``, else ``artifacts.yaml``
    in the cwd). Raises :class:`~edgebuild.errors.ManifestError` for a bad manifest."""
    return Project(manifest)


def _manifest_path(manifest: str | os.PathLike[str] | None) -> Path:
    from edgebuild.core.manifest import manifest_path

    return manifest_path(manifest)


def _log(name: str, log: Log | None) -> Log | None:
    if log is None:
        return None
    return lambda message: log(f"[{name}] {message}")


__all__ = ["ArtifactStatus", "Project", "VerificationFailed", "VerificationReport", "VerifyResult", "open_project"]
