"""One static HTML page of every artifact: ``build/index.html``.

Each artifact of the manifest gets a section with its kind, fingerprint, state
(``doit status``'s answer) and the checks of its ``report.json``, plus the figures
its kind draws (each kind's ``report_figures`` hook: the tower's per-token error
over the image grid, the SigLIP encoder's objective per linear, ...).

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
from typing import TYPE_CHECKING, Any

from edgebuild.core.atomic import write_text
from edgebuild.core.figures import Figure, Plots
from edgebuild.core.project import Artifact
from edgebuild.core.report import REPORT_JSON, REPORT_MD, format_number, read_report
from edgebuild.run.state import ArtifactState, status

if TYPE_CHECKING:
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
    reports = {artifact.name: read_report(artifact.directory) for artifact in artifacts}
    sections = [_artifact_section(index, artifact, statuses[artifact.name], reports[artifact.name])
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
        "</header>",
        _overview(artifacts, statuses, reports),
        *sections,
        "</body>",
        "</html>",
        "",
    ])


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
        return f"up to date, {note}" if note else "up to date", "warn"
    if state == "error":
        return "error", "bad"
    return state + (f" ({note})" if note else ""), "warn"


def _overview(artifacts: list[Artifact], statuses: dict[str, ArtifactState],
              reports: dict[str, dict[str, Any] | None]) -> str:
    rows = []
    for index, artifact in enumerate(artifacts):
        name = artifact.name
        label, css = _state_label(statuses[name])
        report = reports[name]
        checks = report.get("checks", []) if report else []
        passed = sum(1 for check in checks if check.get("passed"))
        rows.append(
            f'<tr><td><a href="#{_anchor(index)}">{escape(name)}</a></td>'
            f"<td>{escape(artifact.params.kind)}</td>"
            f"<td>{_fingerprint(statuses[name].fingerprint)}</td>"
            f'<td><span class="state {css}">{escape(label)}</span></td>'
            f"<td>{f'{passed} / {len(checks)}' if report else '&ndash;'}</td></tr>"
        )
    return (
        '<section class="overview"><table>'
        "<thead><tr><th>artifact</th><th>kind</th><th>fingerprint</th><th>state</th><th>checks passed</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _artifact_section(index: int, artifact: Artifact, state: ArtifactState, report: dict[str, Any] | None) -> str:
    name = artifact.name
    params = artifact.params
    label, css = _state_label(state)
    directory = artifact.directory
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
    if report is None:
        parts.append(f'<p class="note">no verification report yet: <code>doit verify {escape(name)}</code></p>')
    else:
        if state.fingerprint and report.get("fingerprint") != state.fingerprint:
            parts.append(f'<p class="note">this report is of an earlier build ({_fingerprint(report.get("fingerprint"))}), '
                         "not of the current fingerprint</p>")
        quoted = urllib.parse.quote(name)
        parts.append(f'<p class="files"><a href="{quoted}/{REPORT_JSON}">{REPORT_JSON}</a> '
                     f'&middot; <a href="{quoted}/{REPORT_MD}">{REPORT_MD}</a></p>')
        parts.append(_checks_table(report.get("checks", [])))
        try:
            plots = artifact.kind.report_figures(name, directory, report, f"a{index}") or Plots()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            # Files of an older or hand-edited build: the page still shows everything
            # else, and says in one line which plot it could not draw.
            message = " ".join(str(error).split())
            plots = Plots(notes=[f"could not draw this artifact's plots: {type(error).__name__}: {message}"])
        parts.extend(_figure(figure) for figure in plots.figures)
        parts.extend(f'<p class="note">{escape(note)}</p>' for note in plots.notes)
    parts.append("</section>")
    return "\n".join(parts)


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
figure { margin: 14px 0 4px; } figcaption { font-weight: 600; font-size: 14px; margin-bottom: 6px; }
svg.plot { display: block; max-width: 100%; height: auto; }
code { font-size: 12px; }
"""
