"""One static HTML page of every artifact: ``build/index.html``.

A summary table gives each artifact's state (``doit status``'s answer), its kind's
headline check and how that moved since the build the committed lock file names
(``doit diff``). Each artifact then gets a section with its kind, fingerprint, state,
what changed since that build, its time here (``latency``), its coverage certificates
(nodes each target takes, partitions, what falls back) and -- folded, so the page stays short -- the checks
of the ``report.json`` of the build in ``build/`` (never another build's) and the
figures its kind draws (each kind's ``report_figures`` hook: the tower's per-token
error over the image grid, the SigLIP encoder's objective per linear, ...).

The page is cheap to write: it reads the JSON files verification and the builds
left behind (no torch, no onnx, nothing re-run). Plots are inline SVG drawn here,
so the page needs no script, no library and no network, and opens from disk.

The markup is in Jinja2 templates (``templates/``, shipped as package data) with
autoescaping: every value a template shows -- manifest text, a check's detail, a note,
a reason -- is escaped unless the template marks it safe, which it does for one thing
only: the SVG a kind draws. This module decides what the page says; the templates say how. Given the same
inputs the page is the same byte for byte, apart from its "generated at" line.
"""

from __future__ import annotations

import datetime
import functools
import urllib.parse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from edgebuild.core.atomic import write_text
from edgebuild.core.figures import Plots, format_bytes
from edgebuild.core.project import Artifact
from edgebuild.core.record import read_record_or_none
from edgebuild.core.report import REPORT_JSON, REPORT_MD, format_number, read_report, report_passed
from edgebuild.errors import EdgebuildError
from edgebuild.run.state import ArtifactState, statuses

if TYPE_CHECKING:
    from edgebuild.run.diff import ArtifactDiff, CheckChange, Diff
    from edgebuild.run.workspace import Workspace

PAGE_FILE = "index.html"
# The page's markup: Jinja2 templates in edgebuild/cli/report_page/templates/ (package data).
TEMPLATES = "templates"
PAGE_TEMPLATE = "report_page.html.j2"
PARTS_TEMPLATE = "report_parts.html.j2"
FINGERPRINT_CHARS = 12


def write_report_page(workspace: "Workspace", generated_at: datetime.datetime | None = None) -> Path:
    """Write ``build/index.html`` for every artifact of the workspace's manifest; return its path."""
    page = render_report_page(workspace, generated_at or datetime.datetime.now(datetime.timezone.utc))
    path = workspace.layout.build_dir / PAGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, page)
    return path


def render_report_page(workspace: "Workspace", generated_at: datetime.datetime) -> str:
    artifacts = workspace.artifacts
    states = {state.artifact: state for state in statuses(workspace, artifacts)}
    builds = {artifact.name: _build_there(artifact) for artifact in artifacts}
    compared, comparison_note = _compared_with_head(workspace)
    diffs = {item.artifact: item for item in compared.artifacts} if compared is not None else {}
    rows = [_overview_row(index, artifact, states[artifact.name], builds[artifact.name], diffs.get(artifact.name))
            for index, artifact in enumerate(artifacts)]
    sections = [_artifact_section(index, artifact, states[artifact.name], builds[artifact.name],
                                  diffs.get(artifact.name))
                for index, artifact in enumerate(artifacts)]
    return _environment().get_template(PAGE_TEMPLATE).render(
        title=f"edgebuild: {workspace.manifest.path.name}",
        generated_at=generated_at.isoformat(timespec="seconds"),
        comparison_note=comparison_note, compared=compared, rows=rows, sections=sections,
    )


@dataclass(frozen=True)
class _Build:
    """What ``build/<name>/`` holds: the build's fingerprint (from its record) and its
    report -- only when the report is of that same build, never another's."""

    fingerprint: str | None
    report: dict[str, Any] | None
    # A report of another build than the one there (its fingerprint), shown as not this build's.
    other_report: str | None = None


def _build_there(artifact: Artifact) -> _Build:
    record = read_record_or_none(artifact.directory)
    report = read_report(artifact.directory)
    fingerprint = record.fingerprint if record is not None else None
    if report is not None and report.get("fingerprint") != fingerprint:
        return _Build(fingerprint, None, str(report.get("fingerprint")))
    return _Build(fingerprint, report)


def _compared_with_head(workspace: "Workspace") -> tuple["Diff | None", str]:
    """The diff against the committed lock file (``doit diff``), and the line that says so."""
    from edgebuild.run.diff import diff

    try:
        compared = diff(workspace)
    except EdgebuildError as error:
        return None, f"not compared with a committed build: {error}"
    counts = ", ".join(f"{count} {change}" for change, count in sorted(compared.counts().items()))
    notes = "".join(f"; {note}" for note in compared.notes)
    return compared, f"compared with the lock file committed at {compared.against}: {counts}{notes}"


# --- overview and sections --------------------------------------------------------------

def _state_label(state_of: ArtifactState) -> tuple[str, str]:
    """The state as one phrase, and the CSS class that colours it."""
    state = state_of.state
    note = state_of.note or ""
    if state == "up to date":
        if note == "verified":
            return "verified", "good"
        if note == "verification FAILED":
            return "verification failed", "bad"
        if note == "source not verified":
            # Its own checks may have passed: an artifact it is made from did not.
            return "source not verified", "bad"
        return f"up to date, {note}" if note else "up to date", "warn"
    if state == "error":
        return "error", "bad"
    return state + (f" ({note})" if note else ""), "warn"


def _headline(artifact: Artifact, report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The kind's headline check; for a report that failed, its first failed check when the
    headline passed (a failed artifact is not summed up by an output that passed)."""
    checks = [check for check in (report or {}).get("checks", []) if isinstance(check, dict)]
    chosen = artifact.kind.headline([str(check.get("name")) for check in checks])
    headline = next((check for check in checks if check.get("name") == chosen), None) if chosen else None
    if report is not None and not report_passed(report) and (headline is None or headline.get("passed")):
        headline = next((check for check in checks if not check.get("passed")), headline)
    return headline


def _versus_float(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The worst cosine against the float model of the artifact's chain (``vs_float.*``)."""
    checks = [check for check in (report or {}).get("checks", []) if isinstance(check, dict)
              and str(check.get("name", "")).startswith("vs_float.") and str(check.get("name")).endswith(".cosine")
              and isinstance(check.get("value"), (int, float))]
    return min(checks, key=lambda check: check["value"]) if checks else None


@dataclass(frozen=True)
class _Named:
    """A check on the summary line: its name and value."""

    name: str
    value: Any


@dataclass(frozen=True)
class _Row:
    """One artifact's line of the summary table."""

    anchor: str
    name: str
    kind: str
    label: str
    css: str
    headline: _Named | None
    # The headline's change since the committed build, and the artifact's.
    moved: "CheckChange | None"
    change: "ArtifactDiff | None"
    versus_float: _Named | None
    # Checks passed of those run, counted only for the build of the current fingerprint.
    counted: bool
    passed: int
    total: int


@dataclass(frozen=True)
class _Latency:
    """The report's ``latency`` as the page says it: measured (``text`` ``None`` when its
    record could not be read) or, with ``measured`` false, why not (``text``)."""

    measured: bool
    text: str | None
    simulated: bool = False


@dataclass(frozen=True)
class _Coverage:
    """The report's ``coverage``: the counts per target, each certificate (target, the
    certificate, the nodes that fall back in words) and the targets not computed, with why."""

    counts: list[str]
    certificates: list[tuple[str, dict[str, Any], str]]
    not_computed: list[tuple[str, str]]


@dataclass(frozen=True)
class _Section:
    """What one artifact's section shows."""

    anchor: str
    name: str
    kind: str
    label: str
    css: str
    fingerprint: str | None
    description: str | None
    reasons: tuple[str, ...]
    change: "ArtifactDiff | None"
    other_report: str | None
    report: dict[str, Any] | None
    # The fingerprint of the build in build/, and whether it is an earlier one than the current.
    build_fingerprint: str | None = None
    earlier_build: bool = False
    checks: list[dict[str, Any]] = field(default_factory=list)
    passed: int = 0
    # The artifact's directory, relative to the page, as a URL path.
    link: str = ""
    latency: _Latency | None = None
    coverage: _Coverage | None = None
    plots: Plots = field(default_factory=Plots)


def _overview_row(index: int, artifact: Artifact, state: ArtifactState, build: _Build,
                  change: "ArtifactDiff | None") -> _Row:
    name = artifact.name
    label, css = _state_label(state)
    # Checks count only for the build of the current fingerprint: a stale artifact's
    # old checks are not this fingerprint's (its section shows them, as the old build's).
    current = build.report if build.fingerprint is not None and build.fingerprint == state.fingerprint else None
    checks = current.get("checks", []) if current else []
    headline = _headline(artifact, current)
    versus_float = _versus_float(current)
    return _Row(
        anchor=_anchor(index), name=name, kind=artifact.params.kind, label=label, css=css,
        headline=_Named(str(headline["name"]), headline.get("value")) if headline is not None else None,
        moved=change.check(headline["name"]) if headline is not None and change is not None else None,
        change=change,
        versus_float=(_Named(str(versus_float["name"]).removeprefix("vs_float."), versus_float.get("value"))
                      if versus_float is not None else None),
        counted=bool(current), passed=sum(1 for check in checks if check.get("passed")), total=len(checks),
    )


def _artifact_section(index: int, artifact: Artifact, state: ArtifactState, build: _Build,
                      change: "ArtifactDiff | None") -> _Section:
    name = artifact.name
    label, css = _state_label(state)
    section = _Section(
        anchor=_anchor(index), name=name, kind=artifact.params.kind, label=label, css=css,
        fingerprint=state.fingerprint, description=artifact.params.description,
        reasons=tuple(str(reason) for reason in state.reasons), change=change,
        other_report=build.other_report, report=build.report,
    )
    report = build.report
    if report is None:
        return section
    try:
        plots = artifact.kind.report_figures(name, artifact.directory, report, f"a{index}") or Plots()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        # Files of an older or hand-edited build: the page still shows everything
        # else, and says in one line which plot it could not draw.
        message = " ".join(str(error).split())
        plots = Plots(notes=[f"could not draw this artifact's plots: {type(error).__name__}: {message}"])
    checks = report.get("checks", [])
    return replace(
        section, build_fingerprint=build.fingerprint,
        earlier_build=bool(state.fingerprint) and build.fingerprint != state.fingerprint,
        checks=checks, passed=sum(1 for check in checks if check.get("passed")),
        link=urllib.parse.quote(name), latency=_latency_of(report.get("latency")),
        coverage=_coverage_of(report.get("coverage"), report.get("coverage_not_computed")), plots=plots,
    )


def _change_summary(change: "ArtifactDiff", compared: "Diff") -> str:
    """The line a changed artifact's ``doit diff`` is folded under."""
    moved = [check for check in change.checks if check.before != check.after]
    return f"changed since {compared.against}: {len(change.reasons) + len(change.verify_reasons)} change(s)" \
        + (f", {len(moved)} check(s) moved" if moved else "") \
        + (f", {len(change.flipped)} verdict(s) flipped" if change.flipped else "") \
        + (f", coverage moved on {len(change.coverage)} target(s)" if change.coverage else "")


def _latency_of(latency: Any) -> _Latency | None:
    """The report's ``latency``: the time here, against the float source, on what machine."""
    if not isinstance(latency, dict):
        return None
    if not latency.get("measured"):
        return _Latency(False, str(latency.get("reason", "")))
    try:
        interval = latency.get("median_ci95_ms")
        text = f"latency: {format_number(float(latency['median_ms']))} ms median"
        if isinstance(interval, list) and len(interval) == 2:
            # One unit, never a number cut across lines: the interval is one phrase.
            text += f" (95% CI {format_number(float(interval[0]))}–{format_number(float(interval[1]))})"
        text += f", p90 {format_number(float(latency['p90_ms']))}, over {int(latency['runs'])} runs"
        if latency.get("noisy"):
            text += ", noisy"
        source = latency.get("float_source")
        if isinstance(source, dict) and isinstance(latency.get("ratio"), (int, float)):
            text += (f", {format_number(float(latency['ratio']))}x its float source {source.get('artifact')} "
                     f"({format_number(float(source['median_ms']))} ms)")
        elif isinstance(source, dict) and latency.get("ratio_not_stated"):
            text += f"; its ratio to {source.get('artifact')} is {latency['ratio_not_stated']}"
        described = latency.get("machine") if isinstance(latency.get("machine"), dict) else {}
        text += f"; {latency.get('runtime', '')} on {described.get('cpu', '?')} ({described.get('cores', '?')} cores"
        text += f", {described['threads']} threads" if described.get("threads") else ""
        load = latency.get("load") if isinstance(latency.get("load"), dict) else {}
        text += f", load {format_number(float(load['before']))})" if isinstance(load.get("before"), (int, float)) else ")"
    except (KeyError, TypeError, ValueError):
        return _Latency(True, None)
    return _Latency(True, text, bool(latency.get("simulated")))


def _coverage_of(certificates: Any, not_computed: Any) -> _Coverage | None:
    """The report's ``coverage`` (a gate that fails is in the checks, open above)."""
    from edgebuild.ml.modules import describe_fallbacks

    counts, found, missing = [], [], []
    for target, certificate in (certificates.items() if isinstance(certificates, dict) else ()):
        if not isinstance(certificate, dict):
            continue
        fallbacks = certificate.get("fallbacks") if isinstance(certificate.get("fallbacks"), list) else []
        counts.append(f"{target} {certificate.get('nodes_taken')}/{certificate.get('nodes_total')}")
        found.append((str(target), certificate, describe_fallbacks(fallbacks) if fallbacks else ""))
    for target, reason in (not_computed.items() if isinstance(not_computed, dict) else ()):
        missing.append((str(target), str(reason)))
        counts.append(f"{target} not computed")
    return _Coverage(counts, found, missing) if counts else None


def _latency(latency: Any) -> str:
    """The report's ``latency`` as the page shows it ("" when it has none)."""
    found = _latency_of(latency)
    return str(_parts().latency(found)) if found is not None else ""


def _coverage(certificates: Any, not_computed: Any) -> str:
    """The report's ``coverage`` as the page shows it, folded ("" when it has none)."""
    found = _coverage_of(certificates, not_computed)
    return str(_parts().coverage(found)) if found is not None else ""


def _anchor(index: int) -> str:
    # Artifact names may hold characters an id should not; the manifest order is stable.
    return f"artifact-{index}"


@functools.cache
def _environment() -> jinja2.Environment:
    """The templates, autoescaped: a value is escaped unless a template marks it safe."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("edgebuild.cli.report_page", TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
        # Block tags leave no blank lines; the page ends with a newline.
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )
    environment.filters.update(number=format_number, size=format_bytes, signed=lambda value: f"{value:+.3g}",
                               change_summary=_change_summary)
    environment.globals.update(report_json=REPORT_JSON, report_md=REPORT_MD, fingerprint_chars=FINGERPRINT_CHARS)
    return environment


def _parts() -> Any:
    """The page's macros (``report_parts.html.j2``), each callable from here."""
    return _environment().get_template(PARTS_TEMPLATE).module
