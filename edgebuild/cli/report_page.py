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
Every text from a file is escaped. Given the same inputs the page is the same
byte for byte, apart from its "generated at" line.
"""

from __future__ import annotations

import datetime
import urllib.parse
from html import escape
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgebuild.core.atomic import write_text
from edgebuild.core.figures import Figure, Plots
from edgebuild.core.project import Artifact
from edgebuild.core.record import read_record_or_none
from edgebuild.core.report import REPORT_JSON, REPORT_MD, format_number, read_report
from edgebuild.errors import EdgebuildError
from edgebuild.run.state import ArtifactState, status

if TYPE_CHECKING:
    from edgebuild.run.diff import ArtifactDiff, CheckChange, Diff
    from edgebuild.run.workspace import Workspace

PAGE_FILE = "index.html"
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
    statuses = {artifact.name: status(workspace, artifact) for artifact in artifacts}
    builds = {artifact.name: _build_there(artifact) for artifact in artifacts}
    compared, comparison_note = _compared_with_head(workspace)
    diffs = {item.artifact: item for item in compared.artifacts} if compared is not None else {}
    sections = [_artifact_section(index, artifact, statuses[artifact.name], builds[artifact.name],
                                  diffs.get(artifact.name), compared)
                for index, artifact in enumerate(artifacts)]
    title = f"edgebuild: {workspace.manifest.path.name}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title>",
        f"<style>{STYLE}</style>",
        "</head>",
        "<body>",
        "<header>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="generated">generated at {escape(generated_at.isoformat(timespec="seconds"))}</p>',
        f'<p class="compared">{escape(comparison_note)}</p>',
        "</header>",
        _overview(artifacts, statuses, builds, diffs, compared),
        *sections,
        "</body>",
        "</html>",
        "",
    ])


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
    if report is not None and not report.get("passed") and (headline is None or headline.get("passed")):
        headline = next((check for check in checks if not check.get("passed")), headline)
    return headline


def _versus_float(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The worst cosine against the float model of the artifact's chain (``vs_float.*``)."""
    checks = [check for check in (report or {}).get("checks", []) if isinstance(check, dict)
              and str(check.get("name", "")).startswith("vs_float.") and str(check.get("name")).endswith(".cosine")
              and isinstance(check.get("value"), (int, float))]
    return min(checks, key=lambda check: check["value"]) if checks else None


def _overview(artifacts: list[Artifact], statuses: dict[str, ArtifactState], builds: dict[str, _Build],
              diffs: dict[str, "ArtifactDiff"], compared: "Diff | None") -> str:
    rows = []
    for index, artifact in enumerate(artifacts):
        name = artifact.name
        state = statuses[name]
        label, css = _state_label(state)
        build = builds[name]
        # Checks count only for the build of the current fingerprint: a stale artifact's
        # old checks are not this fingerprint's (its section shows them, as the old build's).
        current = build.report if build.fingerprint is not None and build.fingerprint == state.fingerprint else None
        checks = current.get("checks", []) if current else []
        passed = sum(1 for check in checks if check.get("passed"))
        headline = _headline(artifact, current)
        moved = diffs[name].check(headline["name"]) if headline is not None and name in diffs else None
        versus_float = _versus_float(current)
        rows.append(
            f'<tr><td><a href="#{_anchor(index)}">{escape(name)}</a></td>'
            f"<td>{escape(artifact.params.kind)}</td>"
            f'<td><span class="state {css}">{escape(label)}</span></td>'
            + (f'<td>{escape(str(headline["name"]))} {escape(format_number(headline.get("value")))}</td>'
               if headline is not None else "<td>&ndash;</td>")
            + f"<td>{_delta_cell(moved, diffs.get(name))}</td>"
            + (f'<td>{escape(str(versus_float["name"]).removeprefix("vs_float."))} '
               f'{escape(format_number(versus_float.get("value")))}</td>' if versus_float is not None else "<td>&ndash;</td>")
            + f"<td>{f'{passed} / {len(checks)}' if current else '&ndash;'}</td></tr>"
        )
    against = escape(compared.against) if compared is not None else "the committed build"
    return (
        '<section class="overview"><table>'
        f"<thead><tr><th>artifact</th><th>kind</th><th>state</th><th>headline</th><th>since {against}</th>"
        "<th>vs the float model</th><th>checks passed</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _delta_cell(moved: "CheckChange | None", change: "ArtifactDiff | None") -> str:
    if change is None:
        return "&ndash;"
    if change.change in ("added", "error"):
        return escape(change.change if change.change == "error" else "new")
    if moved is None or moved.before is None or moved.after is None:
        return escape(change.change)
    text = "±0" if not moved.delta else f"{moved.delta:+.3g}"
    css = "bad" if moved.flipped and not moved.passed_after else ("good" if moved.flipped else "")
    return f'<span class="{css}" title="{escape(format_number(moved.before))} → {escape(format_number(moved.after))}">' \
           f"{escape(text)}</span>"


def _artifact_section(index: int, artifact: Artifact, state: ArtifactState, build: _Build,
                      change: "ArtifactDiff | None", compared: "Diff | None") -> str:
    name = artifact.name
    params = artifact.params
    label, css = _state_label(state)
    directory = artifact.directory
    report = build.report
    parts = [
        f'<section class="artifact" id="{_anchor(index)}" data-artifact="{escape(name)}">',
        f'<h2>{escape(name)} <span class="state {css}">{escape(label)}</span></h2>',
        f'<p class="meta">kind <code>{escape(params.kind)}</code> &middot; fingerprint '
        f"{_fingerprint(state.fingerprint)}"
        + (f" &middot; {escape(params.description)}" if params.description else "")
        + "</p>",
    ]
    reasons = state.reasons
    if reasons:
        parts.append('<ul class="reasons">' + "".join(f"<li>{escape(str(reason))}</li>" for reason in reasons) + "</ul>")
    if change is not None and compared is not None:
        parts.append(_change_details(change, compared))
    if build.other_report is not None:
        parts.append(f'<p class="note">the report in build/ is of another build ({_fingerprint(build.other_report)}) '
                     "than the one there: not shown</p>")
    if report is None:
        parts.append(f'<p class="note">no verification report yet: <code>doit verify {escape(name)}</code></p>')
    else:
        if state.fingerprint and build.fingerprint != state.fingerprint:
            parts.append(f'<p class="note">build/ holds an earlier build ({_fingerprint(build.fingerprint)}), '
                         "not the current fingerprint: these are its checks</p>")
        checks = report.get("checks", [])
        passed = sum(1 for check in checks if check.get("passed"))
        quoted = urllib.parse.quote(name)
        parts.append(f'<details class="checks"{" open" if passed < len(checks) or not checks else ""}>'
                     f"<summary>checks: {passed} / {len(checks)} passed</summary>")
        parts.append(f'<p class="files"><a href="{quoted}/{REPORT_JSON}">{REPORT_JSON}</a> '
                     f'&middot; <a href="{quoted}/{REPORT_MD}">{REPORT_MD}</a></p>')
        parts.append(_checks_table(checks))
        parts.append("</details>")
        latency = _latency(report.get("latency"))
        if latency:
            parts.append(latency)
        coverage = _coverage(report.get("coverage"), report.get("coverage_not_computed"))
        if coverage:
            parts.append(coverage)
        try:
            plots = artifact.kind.report_figures(name, directory, report, f"a{index}") or Plots()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            # Files of an older or hand-edited build: the page still shows everything
            # else, and says in one line which plot it could not draw.
            message = " ".join(str(error).split())
            plots = Plots(notes=[f"could not draw this artifact's plots: {type(error).__name__}: {message}"])
        if plots.figures:
            parts.append(f'<details class="figures"><summary>figures: '
                         f"{escape(', '.join(figure.title for figure in plots.figures))}</summary>")
            parts.extend(_figure(figure) for figure in plots.figures)
            parts.append("</details>")
        parts.extend(f'<p class="note">{escape(note)}</p>' for note in plots.notes)
    parts.append("</section>")
    return "\n".join(parts)


def _change_details(change: "ArtifactDiff", compared: "Diff") -> str:
    """The artifact's ``doit diff`` against the committed build, folded."""
    against = escape(compared.against)
    if change.change == "unchanged" and not change.flipped and not change.verify_reasons and not change.coverage:
        return f'<p class="change">unchanged since {against}</p>'
    if change.change in ("added", "error", "unknown"):
        text = {"added": "new since", "error": "could not be compared with", "unknown": "not yet comparable with"}[change.change]
        notes = "".join(f" {escape(note)}." for note in change.notes if not note.startswith("not in "))
        return f'<p class="change">{text} {against}.{notes}</p>'
    moved = [check for check in change.checks if check.before != check.after]
    summary = f"changed since {against}: {len(change.reasons) + len(change.verify_reasons)} change(s)" \
        + (f", {len(moved)} check(s) moved" if moved else "") \
        + (f", {len(change.flipped)} verdict(s) flipped" if change.flipped else "") \
        + (f", coverage moved on {len(change.coverage)} target(s)" if change.coverage else "")
    items = "".join(f"<li>{escape(reason)}</li>" for reason in (*change.reasons, *change.verify_reasons))
    parts = [f'<details class="change"><summary>{escape(summary)}</summary>']
    if items:
        parts.append(f'<ul class="changes">{items}</ul>')
    changed_outputs = [output for output in change.outputs if output.changed]
    if changed_outputs:
        parts.append('<table class="outputs"><thead><tr><th>output</th><th>before</th><th>now</th></tr></thead><tbody>'
                     + "".join(f"<tr><td>{escape(output.file)}</td><td>{_bytes(output.size_before)}</td>"
                               f"<td>{_bytes(output.size_after)}</td></tr>" for output in changed_outputs)
                     + "</tbody></table>")
    if change.checks:
        rows = []
        for check in change.checks:
            flipped = (f'<span class="state {"good" if check.passed_after else "bad"}">'
                       f'{"pass" if check.passed_before else "FAIL"} → {"pass" if check.passed_after else "FAIL"}</span>'
                       if check.flipped else "")
            rows.append(f'<tr class="{"fail" if check.passed_after is False else "pass"}"><td>{escape(check.name)}</td>'
                        f"<td>{_value(check.before)}</td><td>{_value(check.after)}</td>"
                        f"<td>{escape(f'{check.delta:+.3g}') if check.delta else ''}</td><td>{flipped}</td></tr>")
        parts.append('<table class="check-changes"><thead><tr><th>check</th><th>before</th><th>now</th><th>delta</th>'
                     f"<th></th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    if change.latency is not None:
        parts.append(f'<p class="latency-change">{escape(change.latency.describe())}</p>')
    parts.extend(f'<p class="coverage-change">{escape(moved.describe())}</p>' for moved in change.coverage)
    parts.extend(f'<p class="note">{escape(note)}</p>' for note in change.notes)
    parts.append("</details>")
    return "\n".join(parts)


def _latency(latency: Any) -> str:
    """The report's ``latency``: the time here, against the float source, on what machine."""
    if not isinstance(latency, dict):
        return ""
    if not latency.get("measured"):
        return f'<p class="latency note">latency: not measured here: {escape(str(latency.get("reason", "")))}</p>'
    try:
        text = (f"latency: {format_number(float(latency['median_ms']))} ms median "
                f"(p90 {format_number(float(latency['p90_ms']))}) over {int(latency['runs'])} runs")
        source = latency.get("float_source")
        if isinstance(source, dict) and isinstance(latency.get("ratio"), (int, float)):
            text += (f", {format_number(float(latency['ratio']))}x its float source {source.get('artifact')} "
                     f"({format_number(float(source['median_ms']))} ms)")
        described = latency.get("machine") if isinstance(latency.get("machine"), dict) else {}
        text += f"; {latency.get('runtime', '')} on {described.get('cpu', '?')} ({described.get('cores', '?')} cores"
        text += f", {described['threads']} threads)" if described.get("threads") else ")"
    except (KeyError, TypeError, ValueError):
        return '<p class="latency note">latency: the report\'s record could not be read</p>'
    simulated = (" <strong>simulated</strong>: the simulator's time says nothing of the device's"
                 if latency.get("simulated") else "")
    return f'<p class="latency">{escape(text)}{simulated}</p>'


def _coverage(certificates: Any, not_computed: Any) -> str:
    """The report's ``coverage``: per target, the nodes it takes, its partitions and the
    nodes that fall back with their modules; folded under a line of the counts (a gate
    that fails is in the checks, open above)."""
    from edgebuild.ml.modules import describe_fallbacks

    rows, counts = [], []
    for target, found in (certificates.items() if isinstance(certificates, dict) else ()):
        if not isinstance(found, dict):
            continue
        fallbacks = found.get("fallbacks") if isinstance(found.get("fallbacks"), list) else []
        counts.append(f"{target} {found.get('nodes_taken')}/{found.get('nodes_total')}")
        rows.append(f'<tr class="{"fail" if fallbacks else "pass"}"><td>{escape(str(target))}</td>'
                    f"<td>{escape(str(found.get('nodes_taken')))} / {escape(str(found.get('nodes_total')))}</td>"
                    f"<td>{escape(str(found.get('partitions')))}</td>"
                    f"<td>{escape(describe_fallbacks(fallbacks)) if fallbacks else ''}</td>"
                    f"<td>{escape(str(found.get('tool')))} {escape(str(found.get('tool_version')))}; "
                    f"{escape(str(found.get('assumption')))}</td></tr>")
    for target, reason in (not_computed.items() if isinstance(not_computed, dict) else ()):
        rows.append(f'<tr class="fail"><td>{escape(str(target))}</td><td colspan="4">not computed: '
                    f"{escape(str(reason))}</td></tr>")
        counts.append(f"{target} not computed")
    if not rows:
        return ""
    return (f'<details class="coverage"><summary>{escape("coverage: " + ", ".join(counts))}</summary>'
            '<table class="coverage"><thead><tr><th>target</th><th>nodes taken</th><th>partitions</th>'
            f"<th>falls back</th><th>tool; assumed</th></tr></thead><tbody>{''.join(rows)}</tbody></table></details>")


def _value(value: Any) -> str:
    return "&ndash;" if value is None else escape(format_number(value))


def _bytes(size: int | None) -> str:
    from edgebuild.run.diff import format_size

    return escape(format_size(size))


def _checks_table(checks: list[dict[str, Any]]) -> str:
    if not checks:
        return '<p class="note bad">no checks ran</p>'
    rows = []
    for check in checks:
        passed = bool(check.get("passed"))
        detail = check.get("detail") or ""
        rows.append(
            f'<tr class="{"pass" if passed else "fail"}">'
            f"<td>{escape(str(check.get('name')))}"
            + (f'<div class="detail">{escape(detail)}</div>' if detail else "")
            + f"</td><td>{escape(format_number(check.get('value')))}</td>"
            f"<td>{escape(str(check.get('comparison', '')))} {escape(format_number(check.get('limit')))}</td>"
            f'<td><span class="state {"good" if passed else "bad"}">{"pass" if passed else "FAIL"}</span></td></tr>'
        )
    return ('<table class="checks"><thead><tr><th>check</th><th>value</th><th>limit</th><th>result</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _figure(figure: Figure) -> str:
    caption = f'<p class="caption">{escape(figure.caption)}</p>' if figure.caption else ""
    return f'<figure><figcaption>{escape(figure.title)}</figcaption>{figure.svg}{caption}</figure>'


def _anchor(index: int) -> str:
    # Artifact names may hold characters an id should not; the manifest order is stable.
    return f"artifact-{index}"


def _fingerprint(fingerprint: str | None) -> str:
    if not fingerprint:
        return "&ndash;"
    return f'<code title="{escape(fingerprint)}">{escape(fingerprint[:FINGERPRINT_CHARS])}</code>'


STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1240px; padding: 0 16px; color: #1d232a; background: #f6f7f9; }
h1 { font-size: 22px; margin: 0; } h2 { font-size: 18px; margin: 0 0 6px; }
.generated, .meta, .caption, .files, .detail { color: #5b6572; font-size: 13px; }
.detail { font-size: 12px; max-width: 560px; }
section { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 14px 18px; margin: 16px 0; }
table { border-collapse: collapse; font-size: 13px; }
th, td { text-align: left; padding: 4px 10px; border-bottom: 1px solid #eceef1; vertical-align: top; }
td { word-break: break-all; } td:first-child { word-break: normal; }
th { color: #5b6572; font-weight: 600; }
tr.fail td { background: #fdecea; }
.state { font-size: 12px; font-weight: 600; padding: 1px 8px; border-radius: 10px; white-space: nowrap; }
.state.good { background: #e3f4e5; color: #1b6e2a; } .state.bad { background: #fde2df; color: #a31b12; }
.state.warn { background: #fff1d6; color: #8a5a00; }
.note { color: #8a5a00; font-size: 13px; } .note.bad { color: #a31b12; }
.compared, .change { color: #5b6572; font-size: 13px; margin: 4px 0; }
details { margin: 6px 0; } summary { cursor: pointer; font-size: 13px; color: #34404d; }
td span.bad { color: #a31b12; font-weight: 600; } td span.good { color: #1b6e2a; font-weight: 600; }
figure { margin: 14px 0 4px; } figcaption { font-weight: 600; font-size: 14px; margin-bottom: 6px; }
svg.plot { display: block; max-width: 100%; height: auto; }
code { font-size: 12px; }
"""
