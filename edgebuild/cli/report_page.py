"""One static HTML page of every artifact: ``build/index.html``.

Each artifact of the manifest gets a section with its kind, fingerprint, state
(``doit status``'s answer) and the checks of its ``report.json``, plus the plots
a person would rather look at than read: the tower's per-token error over the
image grid and its error histogram; the SigLIP encoder's objective per linear
(nearest vs reconstructed) and cosine per image; the FP8 graph's size breakdown.

The page is cheap to write: it reads the JSON files verification and the builds
left behind (no torch, no onnx, nothing re-run). Plots are inline SVG drawn here,
so the page needs no script, no library and no network, and opens from disk.
Every text from a file is escaped. Given the same inputs the page is the same
byte for byte, apart from its "generated at" line.
"""

from __future__ import annotations

import datetime
import json
import math
import urllib.parse
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Callable

from edgebuild.core.atomic import write_text
from edgebuild.kinds.siglip_f143.params import REPORT_FILE as QUANTIZATION_FILE
from edgebuild.kinds.siglip_f143_onnx.params import INFO_FILE as EXPORT_FILE
from edgebuild.core.project import Project
from edgebuild.core.report import REPORT_JSON, REPORT_MD, _number as format_number, read_report
from edgebuild.run.state import artifact_status

PAGE_FILE = "index.html"
FINGERPRINT_CHARS = 12

# A perceptually even ramp (viridis' anchors) from small error to large.
RAMP = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]
NEAREST_COLOR = "#9aa3ad"
RECONSTRUCTED_COLOR = "#2f6fb0"
FAIL_COLOR = "#c62828"
FP8_COLORS = {"FP8 codes": "#2f6fb0", "scales": "#f0a030", "quantized weights": "#9aa3ad", "everything else": "#d5dae0"}


@dataclass
class Figure:
    """One plot (inline SVG) with its title and a line on how to read it."""

    title: str
    svg: str
    caption: str = ""


@dataclass
class Plots:
    """What a kind's plotter found: figures, and one-line notes on what it could not draw."""

    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def write_report_page(project: Project, generated_at: datetime.datetime | None = None) -> Path:
    """Write ``build/index.html`` for every artifact of ``project``'s manifest; return its path."""
    page = render_report_page(project, generated_at or datetime.datetime.now(datetime.timezone.utc))
    path = project.layout.build_dir / PAGE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, page)
    return path


def render_report_page(project: Project, generated_at: datetime.datetime) -> str:
    names = list(project.manifest.artifacts)
    statuses = {name: artifact_status(project, name) for name in names}
    reports = {name: read_report(project.layout.artifact_dir(name)) for name in names}
    sections = [_artifact_section(project, index, name, statuses[name], reports[name]) for index, name in enumerate(names)]
    title = f"edgebuild: {project.manifest.path.name}"
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
        _overview(names, project, statuses, reports),
        *sections,
        "</body>",
        "</html>",
        "",
    ])


# --- overview and sections --------------------------------------------------------------

def _state_label(status: dict[str, Any]) -> tuple[str, str]:
    """The state as one phrase, and the CSS class that colours it."""
    state = status.get("state", "error")
    note = status.get("note", "")
    if state == "up to date":
        if note == "verified":
            return "verified", "good"
        if note == "verification FAILED":
            return "verification failed", "bad"
        return f"up to date, {note}" if note else "up to date", "warn"
    if state == "error":
        return "error", "bad"
    return state + (f" ({note})" if note else ""), "warn"


def _overview(names: list[str], project: Project, statuses: dict[str, dict[str, Any]],
              reports: dict[str, dict[str, Any] | None]) -> str:
    rows = []
    for index, name in enumerate(names):
        label, css = _state_label(statuses[name])
        report = reports[name]
        checks = report.get("checks", []) if report else []
        passed = sum(1 for check in checks if check.get("passed"))
        rows.append(
            f'<tr><td><a href="#{_anchor(index)}">{escape(name)}</a></td>'
            f"<td>{escape(project.manifest.artifacts[name].kind)}</td>"
            f"<td>{_fingerprint(statuses[name].get('fingerprint'))}</td>"
            f'<td><span class="state {css}">{escape(label)}</span></td>'
            f"<td>{f'{passed} / {len(checks)}' if report else '&ndash;'}</td></tr>"
        )
    return (
        '<section class="overview"><table>'
        "<thead><tr><th>artifact</th><th>kind</th><th>fingerprint</th><th>state</th><th>checks passed</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _artifact_section(project: Project, index: int, name: str, status: dict[str, Any],
                      report: dict[str, Any] | None) -> str:
    params = project.manifest.artifacts[name]
    label, css = _state_label(status)
    directory = project.layout.artifact_dir(name)
    parts = [
        f'<section class="artifact" id="{_anchor(index)}" data-artifact="{escape(name)}">',
        f'<h2>{escape(name)} <span class="state {css}">{escape(label)}</span></h2>',
        f'<p class="meta">kind <code>{escape(params.kind)}</code> &middot; fingerprint '
        f"{_fingerprint(status.get('fingerprint'))}"
        + (f" &middot; {escape(params.description)}" if params.description else "")
        + "</p>",
    ]
    reasons = status.get("reasons") or []
    if reasons:
        parts.append('<ul class="reasons">' + "".join(f"<li>{escape(str(reason))}</li>" for reason in reasons) + "</ul>")
    if report is None:
        parts.append(f'<p class="note">no verification report yet: <code>doit verify {escape(name)}</code></p>')
    else:
        if status.get("fingerprint") and report.get("fingerprint") != status.get("fingerprint"):
            parts.append(f'<p class="note">this report is of an earlier build ({_fingerprint(report.get("fingerprint"))}), '
                         "not of the current fingerprint</p>")
        quoted = urllib.parse.quote(name)
        parts.append(f'<p class="files"><a href="{quoted}/{REPORT_JSON}">{REPORT_JSON}</a> '
                     f'&middot; <a href="{quoted}/{REPORT_MD}">{REPORT_MD}</a></p>')
        parts.append(_checks_table(report.get("checks", [])))
        plotter = KIND_PLOTS.get(params.kind)
        if plotter is not None:
            plots = Plots()
            try:
                plotter(index, name, directory, report, plots)
            except (KeyError, TypeError, ValueError, IndexError) as error:
                # Files of an older or hand-edited build: the page still shows everything
                # else, and says in one line which plot it could not draw.
                message = " ".join(str(error).split())
                plots.notes.append(f"could not draw this artifact's plots: {type(error).__name__}: {message}")
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


def _check(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((check for check in report.get("checks", []) if check.get("name") == name), None)


def _read_json(path: Path, notes: list[str]) -> Any:
    """The JSON in ``path``, or ``None`` with a one-line note on why not."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        notes.append(f"{path.name}: missing")
    except (ValueError, UnicodeDecodeError) as error:
        notes.append(f"{path.name}: not valid JSON ({error})")
    return None


# --- the kinds' plots ---------------------------------------------------------------------

def _tower_plots(index: int, name: str, directory: Path, report: dict[str, Any], plots: Plots) -> None:
    errors = report.get("metrics", {}).get("token_errors")
    if errors is None:
        plots.notes.append(f"per-token errors are not in this report (verified by an older edgebuild): "
                           f"`doit verify {name}` records them")
        return
    limit_check = _check(report, "max_abs")
    limit = limit_check.get("limit") if limit_check else None
    rows, columns = errors["grid"]
    values = [float(value) for value in errors["max_abs"]]
    if rows * columns != len(values):
        raise ValueError(f"token_errors: grid {rows}x{columns} but {len(values)} tokens")
    plots.figures.append(Figure(
        f"max |error| per merged token ({rows} x {columns} grid)",
        heatmap_svg(values, rows, columns, f"a{index}-heat", limit),
        "Each cell is one output token (a merged block of patches), laid out as on the image, coloured by its "
        "largest absolute error over the hidden dimension and over every sample (log scale)."
        + (" Red outline: above the max_abs limit." if limit is not None else ""),
    ))
    histogram = errors["histogram"]
    plots.figures.append(Figure(
        "|error| of every output value",
        histogram_svg([float(edge) for edge in histogram["edges"]], [int(count) for count in histogram["counts"]], limit),
        "Fixed half-decade bins, the same for every build, so two histograms compare bin for bin."
        + (" Dashed red: the max_abs limit." if limit is not None else ""),
    ))


def _siglip_plots(index: int, name: str, directory: Path, report: dict[str, Any], plots: Plots) -> None:
    quantization = _read_json(directory / QUANTIZATION_FILE, plots.notes)
    if quantization is not None:
        objectives = quantization["objectives"]
        if objectives:
            plots.figures.append(Figure(
                f"reconstruction objective per linear ({len(objectives)} linears)",
                objectives_svg({linear: (float(value["nearest"]), float(value["reconstructed"]))
                                for linear, value in objectives.items()}),
                "The calibration-weighted error of rounding each weight to its nearest F143 value, and of the "
                f"reconstructed weights (log scale); the factor on the right is their ratio. Overall ratio "
                f"{format_number(quantization.get('objective_ratio'))}.",
            ))
    cosines = report.get("metrics", {}).get("image_cosines")
    if cosines is None:
        plots.notes.append(f"per-image cosines are not in this report (verified by an older edgebuild): "
                           f"`doit verify {name}` records them")
    elif any(cosines.values()):
        limit_check = _check(report, "held_out.cosine") or _check(report, "calibration.cosine")
        plots.figures.append(Figure(
            "cosine per image, quantized vs float encoder",
            cosines_svg({label: [float(value) for value in values] for label, values in cosines.items()},
                        limit_check.get("limit") if limit_check else None),
            "Cosine of each image's last_hidden_state with the float encoder's. Dashed red: the cosine limit.",
        ))


def _onnx_plots(index: int, name: str, directory: Path, report: dict[str, Any], plots: Plots) -> None:
    export = _read_json(directory / EXPORT_FILE, plots.notes)
    if export is not None:
        breakdown = fp8_size_breakdown(export, report)
        if breakdown is not None:
            plots.figures.append(Figure(
                "graph size: FP8 weights vs float weights",
                size_breakdown_svg(breakdown),
                "model.onnx with its external data. The quantized linears' weights become one byte of FP8 code "
                "per weight and a float32 scale per 64 inputs; everything else (other weights, the graph) stays.",
            ))
        else:
            plots.notes.append(f"graph {_bytes(export['graph_bytes'])} vs {_bytes(export['float_graph_bytes'])} "
                               "with float weights (no FP8 weights to break down)")
    float_metrics = report.get("metrics", {}).get("vs_float")
    if float_metrics:
        limit_check = _check(report, "vs_float.cosine")
        plots.figures.append(Figure(
            "cosine per image, onnxruntime vs float encoder",
            cosines_svg({str(report.get("metrics", {}).get("inputs", "inputs")): [float(item["cosine"]) for item in float_metrics]},
                        limit_check.get("limit") if limit_check else None),
            "Cosine of each image's last_hidden_state from the FP8 graph with the float encoder's. "
            "Dashed red: the cosine limit.",
        ))


# Per kind: draw into ``plots`` from the artifact's directory and report (index: for unique SVG ids).
KIND_PLOTS: dict[str, Callable[[int, str, Path, dict[str, Any], Plots], None]] = {
    "qwen3_5_vision_tower": _tower_plots,
    "siglip_f143": _siglip_plots,
    "siglip_f143_onnx": _onnx_plots,
}


def fp8_size_breakdown(export: dict[str, Any], report: dict[str, Any]) -> dict[str, dict[str, int]] | None:
    """Bytes of the FP8 graph (codes, scales, everything else) and of the same graph with
    float weights (the quantized weights, everything else); ``None`` without FP8 weights."""
    rewritten = export.get("rewritten") or {}
    if export.get("weights") != "fp8" or not rewritten:
        return None
    metrics = report.get("metrics", {})
    # One byte of FP8 code per weight.
    code_bytes = int(metrics.get("fp8_code_bytes") or sum(rows * columns for rows, columns in
                                                         (meta["shape"] for meta in rewritten.values())))
    scale_bytes = metrics.get("fp8_scale_bytes")
    if scale_bytes is None:
        # quantized_weight_ratio is (code bytes + scale bytes) / (the same weights in float32 bytes).
        ratio_check = _check(report, "quantized_weight_ratio")
        if ratio_check is None:
            return None
        scale_bytes = round(float(ratio_check["value"]) * code_bytes * 4) - code_bytes
    weight_bytes = code_bytes * (2 if export.get("dtype") == "float16" else 4)
    graph_bytes, float_graph_bytes = int(export["graph_bytes"]), int(export["float_graph_bytes"])
    return {
        f"graph with {export.get('dtype', 'float32')} weights": {
            "quantized weights": weight_bytes,
            "everything else": float_graph_bytes - weight_bytes,
        },
        "graph with FP8 weights": {
            "FP8 codes": code_bytes,
            "scales": int(scale_bytes),
            "everything else": graph_bytes - code_bytes - int(scale_bytes),
        },
    }


# --- SVG ------------------------------------------------------------------------------------

FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def _svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}">'
            + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {FONT}{extra}>{escape(text)}</text>'


def ramp_color(fraction: float) -> str:
    """The colour at ``fraction`` (0..1) of :data:`RAMP`, interpolated."""
    fraction = min(max(fraction, 0.0), 1.0) * (len(RAMP) - 1)
    low = min(int(fraction), len(RAMP) - 2)
    mix = fraction - low
    start, end = (tuple(int(color[i:i + 2], 16) for i in (1, 3, 5)) for color in (RAMP[low], RAMP[low + 1]))
    return "#" + "".join(f"{round(a + (b - a) * mix):02x}" for a, b in zip(start, end))


def _log10(value: float) -> float:
    # Exact zeros (a bit-exact export) sit at the bottom of a log scale.
    return math.log10(value) if value > 0 else -12.0


def _sci(value: float) -> str:
    return f"{value:.2g}" if 1e-2 <= abs(value) < 1e3 else f"{value:.1e}"


def heatmap_svg(values: list[float], rows: int, columns: int, gradient_id: str, limit: float | None = None) -> str:
    """A rows x columns grid of cells coloured by log10(value), with a colour bar."""
    cell = max(4.0, min(36.0, 440.0 / max(rows, columns)))
    logs = [_log10(value) for value in values if not math.isnan(value)]
    low, high = (min(logs), max(logs)) if logs else (0.0, 1.0)
    span = high - low or 1.0
    body = []
    for token, value in enumerate(values):
        row, column = divmod(token, columns)
        color = "#ff00ff" if math.isnan(value) else ramp_color((_log10(value) - low) / span)
        over = limit is not None and not value <= limit
        stroke = f' stroke="{FAIL_COLOR}" stroke-width="2"' if over else ""
        body.append(f'<rect class="cell" x="{column * cell:.1f}" y="{row * cell:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
                    f'fill="{color}"{stroke}><title>token {token} (row {row}, column {column}): '
                    f"max |error| {escape(_sci(value))}</title></rect>")
    grid_width, grid_height = columns * cell, rows * cell
    bar_x, bar_height = grid_width + 24, max(grid_height, 120.0)
    stops = "".join(f'<stop offset="{i / (len(RAMP) - 1):.2f}" stop-color="{color}"/>' for i, color in enumerate(reversed(RAMP)))
    body.append(f'<defs><linearGradient id="{gradient_id}" x1="0" y1="0" x2="0" y2="1">{stops}</linearGradient></defs>')
    body.append(f'<rect x="{bar_x:.1f}" y="0" width="14" height="{bar_height:.1f}" fill="url(#{gradient_id})"/>')
    body.append(_text(bar_x + 20, 10, _sci(10 ** high) if logs else "-"))
    body.append(_text(bar_x + 20, bar_height, _sci(10 ** low) if logs else "-"))
    body.append(_text(bar_x + 20, bar_height / 2 + 4, "max |error|"))
    return _svg(bar_x + 110, max(grid_height, bar_height) + 2, body, f"heatmap of {len(values)} token errors")


def histogram_svg(edges: list[float], counts: list[int], limit: float | None = None) -> str:
    """Bars of ``counts``: bin 0 below ``edges[0]``, bin i in [edges[i-1], edges[i]), the last at or above ``edges[-1]``."""
    if len(counts) != len(edges) + 1:
        raise ValueError(f"histogram: {len(edges)} edges need {len(edges) + 1} counts, found {len(counts)}")
    left, top, bar, plot_height = 52.0, 12.0, 22.0, 160.0
    peak = max(counts) or 1
    body = [f'<line x1="{left}" y1="{top + plot_height}" x2="{left + bar * len(counts)}" y2="{top + plot_height}" stroke="#444"/>',
            _text(left - 6, top + 4, str(peak), "end"), _text(left - 6, top + plot_height, "0", "end"),
            _text(12, top + plot_height / 2, "values", "middle", f' transform="rotate(-90 12 {top + plot_height / 2:.1f})"')]
    for position, count in enumerate(counts):
        low = f"{_sci(edges[position - 1])}" if position else "0"
        high = f"{_sci(edges[position])}" if position < len(edges) else "inf"
        height = plot_height * count / peak
        if count:
            # A bin with a few values among thousands stays visible.
            height = max(height, 1.5)
        body.append(f'<rect class="bar" x="{left + position * bar + 1:.1f}" y="{top + plot_height - height:.1f}" '
                    f'width="{bar - 2:.1f}" height="{height:.1f}" fill="{RECONSTRUCTED_COLOR}">'
                    f"<title>[{escape(low)}, {escape(high)}): {count}</title></rect>")
    # Label every other edge (the decades): edge i sits between bar i and bar i+1.
    for position, edge in enumerate(edges):
        if round(math.log10(edge) * 2) % 2 == 0:
            x = left + (position + 1) * bar
            body.append(f'<line x1="{x:.1f}" y1="{top + plot_height}" x2="{x:.1f}" y2="{top + plot_height + 4}" stroke="#444"/>')
            body.append(_text(x, top + plot_height + 16, f"1e{round(math.log10(edge))}", "middle"))
    if limit is not None and limit > 0:
        x = left + _edge_position(edges, limit) * bar
        body.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{top + plot_height}" stroke="{FAIL_COLOR}" '
                    f'stroke-dasharray="4 3" stroke-width="1.5"/>')
        body.append(_text(x + 4, top + 4, f"limit {_sci(limit)}", "start", f' fill="{FAIL_COLOR}"'))
    body.append(_text(left + bar * len(counts) / 2, top + plot_height + 32, "|error|", "middle"))
    return _svg(left + bar * len(counts) + 60, top + plot_height + 40, body, "histogram of absolute errors")


def _edge_position(edges: list[float], value: float) -> float:
    """Where ``value`` falls on the histogram's axis, in bars (log-interpolated between edges)."""
    logs = [math.log10(edge) for edge in edges]
    target = math.log10(value)
    if target <= logs[0]:
        return 1.0
    for position in range(1, len(logs)):
        if target <= logs[position]:
            return position + (target - logs[position - 1]) / (logs[position] - logs[position - 1])
    return float(len(edges))


def objectives_svg(objectives: dict[str, tuple[float, float]]) -> str:
    """Per linear, two bars on one log axis: the nearest-rounding objective and the reconstructed one."""
    labels = {linear: _short_linear(linear) for linear in objectives}
    positive = [value for pair in objectives.values() for value in pair if value > 0]
    low = math.floor(math.log10(min(positive))) if positive else -1
    high = math.ceil(math.log10(max(positive))) if positive else 0
    high = max(high, low + 1)
    label_width = 8 + 6.5 * max(len(label) for label in labels.values())
    axis_width, row, top = 420.0, 20.0, 30.0

    def x_of(value: float) -> float:
        return label_width + axis_width * (min(max(_log10(value), low), high) - low) / (high - low)

    body = [
        f'<rect x="{label_width}" y="4" width="10" height="10" fill="{NEAREST_COLOR}"/>',
        _text(label_width + 14, 13, "nearest F143 value"),
        f'<rect x="{label_width + 140}" y="4" width="10" height="10" fill="{RECONSTRUCTED_COLOR}"/>',
        _text(label_width + 154, 13, "reconstructed"),
    ]
    for decade in range(low, high + 1):
        x = label_width + axis_width * (decade - low) / (high - low)
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + row * len(objectives)}" stroke="#e3e6ea"/>')
        body.append(_text(x, top + row * len(objectives) + 14, f"1e{decade}", "middle"))
    for position, (linear, (nearest, reconstructed)) in enumerate(objectives.items()):
        y = top + position * row
        body.append(_text(label_width - 6, y + 13, labels[linear], "end"))
        for offset, value, color, what in ((2, nearest, NEAREST_COLOR, "nearest"), (10, reconstructed, RECONSTRUCTED_COLOR, "reconstructed")):
            body.append(f'<rect class="bar" x="{label_width}" y="{y + offset:.1f}" width="{x_of(value) - label_width:.1f}" height="7" '
                        f'fill="{color}"><title>{escape(linear)}: {what} {escape(_sci(value))}</title></rect>')
        ratio = reconstructed / nearest if nearest else float("nan")
        body.append(_text(label_width + axis_width + 8, y + 13, f"x{ratio:.3f}"))
    return _svg(label_width + axis_width + 60, top + row * len(objectives) + 22, body,
                f"objectives of {len(objectives)} linears")


def _short_linear(name: str) -> str:
    # SigLIP's linears all sit under encoder.layers.N; the layer number and the module say it all.
    return name.removeprefix("encoder.layers.").removesuffix(".weight")


def cosines_svg(groups: dict[str, list[float]], limit: float | None = None) -> str:
    """One bar per image, grouped (calibration, held out), on an axis from just below the
    lowest cosine (or the limit) to 1."""
    values = [value for group in groups.values() for value in group if not math.isnan(value)]
    floor = min(values + ([limit] if limit is not None else [])) if values else 0.0
    bottom = max(-1.0, 1 - 1.25 * (1 - floor)) if floor < 1 else 0.99
    left, top, plot_height, bar, gap = 80.0, 14.0, 150.0, 22.0, 26.0

    def y_of(value: float) -> float:
        return top + plot_height * (1 - (min(max(value, bottom), 1.0) - bottom) / (1 - bottom))

    body = [_text(left - 6, top + 4, "1", "end"), _text(left - 6, top + plot_height, f"{bottom:.6g}", "end")]
    x = left + 6
    for label, group in groups.items():
        start = x
        for number, value in enumerate(group):
            y = y_of(value)
            passed = limit is None or value >= limit
            body.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar - 4:.1f}" height="{top + plot_height - y:.1f}" '
                        f'fill="{RECONSTRUCTED_COLOR if passed else FAIL_COLOR}"><title>{escape(label)} image {number}: '
                        f"cosine {value:.8f}</title></rect>")
            x += bar
        body.append(_text((start + x) / 2, top + plot_height + 16, label, "middle"))
        x += gap
    body.append(f'<line x1="{left}" y1="{top + plot_height}" x2="{x:.1f}" y2="{top + plot_height}" stroke="#444"/>')
    if limit is not None:
        y = y_of(limit)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{x:.1f}" y2="{y:.1f}" stroke="{FAIL_COLOR}" stroke-dasharray="4 3" stroke-width="1.5"/>')
        body.append(_text(x + 4, y + 4, f"limit {limit:.6g}", "start", f' fill="{FAIL_COLOR}"'))
    return _svg(x + 90, top + plot_height + 26, body, "cosine per image")


def size_breakdown_svg(breakdown: dict[str, dict[str, int]]) -> str:
    """One stacked bar per graph, on one byte scale."""
    label_width, axis_width, row, top = 180.0, 520.0, 34.0, 8.0
    largest = max(sum(parts.values()) for parts in breakdown.values()) or 1
    body = []
    for position, (graph, parts) in enumerate(breakdown.items()):
        y = top + position * row
        total = sum(parts.values())
        body.append(_text(label_width - 8, y + 15, graph, "end"))
        x = label_width
        for part, size in parts.items():
            width = axis_width * max(size, 0) / largest
            body.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="20" fill="{FP8_COLORS[part]}">'
                        f"<title>{escape(part)}: {escape(_bytes(size))} ({100 * size / total:.1f}%)</title></rect>")
            x += width
        body.append(_text(x + 6, y + 15, _bytes(total)))
    legend_y = top + row * len(breakdown) + 6
    x = label_width
    for part in dict.fromkeys(part for parts in breakdown.values() for part in parts):
        sizes = " / ".join(_bytes(parts[part]) for parts in breakdown.values() if part in parts)
        body.append(f'<rect x="{x:.1f}" y="{legend_y:.1f}" width="10" height="10" fill="{FP8_COLORS[part]}"/>')
        text = f"{part} {sizes}"
        body.append(_text(x + 14, legend_y + 9, text))
        x += 30 + 6.2 * len(text)
    return _svg(max(label_width + axis_width + 90, x), legend_y + 18, body, "graph size breakdown")


def _bytes(size: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} B"


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
