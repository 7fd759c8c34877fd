"""Figures for the report page: what a kind's ``report_figures`` hook returns, and the
inline-SVG charts it draws them with.

The page (``doit report``) needs no script, no library and no network: every chart
is SVG text made here, every text from a file is escaped, and the same inputs give
the same bytes. Each chart takes plain numbers; a kind decides which of its files
and metrics to show (``edgebuild/kinds/*/figures.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from edgebuild.core.files import REPORT_BYTES, UnreadableFile, read_json

# A perceptually even ramp (viridis' anchors) from small to large.
RAMP = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]
MUTED_COLOR = "#9aa3ad"
MAIN_COLOR = "#2f6fb0"
FAIL_COLOR = "#c62828"
FONT = 'font-family="system-ui, sans-serif" font-size="11"'


@dataclass
class Figure:
    """One plot (inline SVG) with its title and a line on how to read it."""

    title: str
    svg: str
    caption: str = ""


@dataclass
class Plots:
    """What a kind's ``report_figures`` found: figures, and one-line notes on what it
    could not draw (a file missing, a report from an older edgebuild)."""

    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def check_of(report: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The check ``name`` of a verification report, as its JSON holds it."""
    return next((check for check in report.get("checks", []) if check.get("name") == name), None)


def read_json_file(path: Path, notes: list[str]) -> Any:
    """The JSON in ``path``, or ``None`` with a one-line note on why not."""
    try:
        return read_json(path, REPORT_BYTES)
    except FileNotFoundError:
        notes.append(f"{path.name}: missing")
    except UnreadableFile as error:
        notes.append(f"{path.name}: {error}")
    except OSError as error:
        notes.append(f"{path.name}: cannot read ({error.strerror or error})")
    return None


def format_bytes(size: float | None) -> str:
    """``1.5e6`` -> ``1.5 MB`` (decimal units, as a chart's legend shows them); ``–`` for
    none (a file one side of a comparison does not have)."""
    if size is None:
        return "–"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(size) >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.0f} B"


def svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(label)}">'
            + "".join(body) + "</svg>")


def text(x: float, y: float, content: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {FONT}{extra}>{escape(content)}</text>'


def ramp_color(fraction: float) -> str:
    """The colour at ``fraction`` (0..1) of :data:`RAMP`, interpolated."""
    fraction = min(max(fraction, 0.0), 1.0) * (len(RAMP) - 1)
    low = min(int(fraction), len(RAMP) - 2)
    mix = fraction - low
    start, end = (tuple(int(color[i:i + 2], 16) for i in (1, 3, 5)) for color in (RAMP[low], RAMP[low + 1]))
    return "#" + "".join(f"{round(a + (b - a) * mix):02x}" for a, b in zip(start, end))


def log10(value: float) -> float:
    # Exact zeros (a bit-exact export) sit at the bottom of a log scale.
    return math.log10(value) if value > 0 else -12.0


def sci(value: float) -> str:
    return f"{value:.2g}" if 1e-2 <= abs(value) < 1e3 else f"{value:.1e}"


def heatmap_svg(values: list[float], rows: int, columns: int, gradient_id: str, limit: float | None = None,
                quantity: str = "max |error|") -> str:
    """A rows x columns grid of cells coloured by log10(value), with a colour bar; cells
    above ``limit`` outlined in red."""
    cell = max(4.0, min(36.0, 440.0 / max(rows, columns)))
    logs = [log10(value) for value in values if not math.isnan(value)]
    low, high = (min(logs), max(logs)) if logs else (0.0, 1.0)
    span = high - low or 1.0
    body = []
    for index, value in enumerate(values):
        row, column = divmod(index, columns)
        color = "#ff00ff" if math.isnan(value) else ramp_color((log10(value) - low) / span)
        over = limit is not None and not value <= limit
        stroke = f' stroke="{FAIL_COLOR}" stroke-width="2"' if over else ""
        body.append(f'<rect class="cell" x="{column * cell:.1f}" y="{row * cell:.1f}" width="{cell:.1f}" height="{cell:.1f}" '
                    f'fill="{color}"{stroke}><title>token {index} (row {row}, column {column}): '
                    f"{escape(quantity)} {escape(sci(value))}</title></rect>")
    grid_width, grid_height = columns * cell, rows * cell
    bar_x, bar_height = grid_width + 24, max(grid_height, 120.0)
    stops = "".join(f'<stop offset="{i / (len(RAMP) - 1):.2f}" stop-color="{color}"/>' for i, color in enumerate(reversed(RAMP)))
    body.append(f'<defs><linearGradient id="{gradient_id}" x1="0" y1="0" x2="0" y2="1">{stops}</linearGradient></defs>')
    body.append(f'<rect x="{bar_x:.1f}" y="0" width="14" height="{bar_height:.1f}" fill="url(#{gradient_id})"/>')
    body.append(text(bar_x + 20, 10, sci(10 ** high) if logs else "-"))
    body.append(text(bar_x + 20, bar_height, sci(10 ** low) if logs else "-"))
    body.append(text(bar_x + 20, bar_height / 2 + 4, quantity))
    return svg(bar_x + 110, max(grid_height, bar_height) + 2, body, f"heatmap of {len(values)} token errors")


def histogram_svg(edges: list[float], counts: list[int], limit: float | None = None, quantity: str = "|error|") -> str:
    """Bars of ``counts``: bin 0 below ``edges[0]``, bin i in [edges[i-1], edges[i]), the last
    at or above ``edges[-1]``; a dashed line at ``limit``."""
    if len(counts) != len(edges) + 1:
        raise ValueError(f"histogram: {len(edges)} edges need {len(edges) + 1} counts, found {len(counts)}")
    left, top, bar, plot_height = 52.0, 12.0, 22.0, 160.0
    peak = max(counts) or 1
    body = [f'<line x1="{left}" y1="{top + plot_height}" x2="{left + bar * len(counts)}" y2="{top + plot_height}" stroke="#444"/>',
            text(left - 6, top + 4, str(peak), "end"), text(left - 6, top + plot_height, "0", "end"),
            text(12, top + plot_height / 2, "values", "middle", f' transform="rotate(-90 12 {top + plot_height / 2:.1f})"')]
    for position, count in enumerate(counts):
        low = f"{sci(edges[position - 1])}" if position else "0"
        high = f"{sci(edges[position])}" if position < len(edges) else "inf"
        height = plot_height * count / peak
        if count:
            # A bin with a few values among thousands stays visible.
            height = max(height, 1.5)
        body.append(f'<rect class="bar" x="{left + position * bar + 1:.1f}" y="{top + plot_height - height:.1f}" '
                    f'width="{bar - 2:.1f}" height="{height:.1f}" fill="{MAIN_COLOR}">'
                    f"<title>[{escape(low)}, {escape(high)}): {count}</title></rect>")
    # Label every other edge (the decades): edge i sits between bar i and bar i+1.
    for position, edge in enumerate(edges):
        if round(math.log10(edge) * 2) % 2 == 0:
            x = left + (position + 1) * bar
            body.append(f'<line x1="{x:.1f}" y1="{top + plot_height}" x2="{x:.1f}" y2="{top + plot_height + 4}" stroke="#444"/>')
            body.append(text(x, top + plot_height + 16, f"1e{round(math.log10(edge))}", "middle"))
    if limit is not None and limit > 0:
        x = left + _edge_position(edges, limit) * bar
        body.append(f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{top + plot_height}" stroke="{FAIL_COLOR}" '
                    f'stroke-dasharray="4 3" stroke-width="1.5"/>')
        body.append(text(x + 4, top + 4, f"limit {sci(limit)}", "start", f' fill="{FAIL_COLOR}"'))
    body.append(text(left + bar * len(counts) / 2, top + plot_height + 32, quantity, "middle"))
    return svg(left + bar * len(counts) + 60, top + plot_height + 40, body, "histogram of absolute errors")


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


def paired_log_bars_svg(pairs: dict[str, tuple[float, float]], legend: tuple[str, str],
                        labels: dict[str, str] | None = None) -> str:
    """Per row, two bars on one log axis (``legend`` names them, muted then main colour),
    and their ratio on the right. Rows are shown by ``labels`` (default: their keys); a
    bar's tooltip names the full key."""
    labels = labels or {key: key for key in pairs}
    positive = [value for pair in pairs.values() for value in pair if value > 0]
    low = math.floor(math.log10(min(positive))) if positive else -1
    high = math.ceil(math.log10(max(positive))) if positive else 0
    high = max(high, low + 1)
    label_width = 8 + 6.5 * max((len(label) for label in labels.values()), default=1)
    axis_width, row, top = 420.0, 20.0, 30.0

    def x_of(value: float) -> float:
        return label_width + axis_width * (min(max(log10(value), low), high) - low) / (high - low)

    body = [
        f'<rect x="{label_width}" y="4" width="10" height="10" fill="{MUTED_COLOR}"/>',
        text(label_width + 14, 13, legend[0]),
        f'<rect x="{label_width + 140}" y="4" width="10" height="10" fill="{MAIN_COLOR}"/>',
        text(label_width + 154, 13, legend[1]),
    ]
    for decade in range(low, high + 1):
        x = label_width + axis_width * (decade - low) / (high - low)
        body.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + row * len(pairs)}" stroke="#e3e6ea"/>')
        body.append(text(x, top + row * len(pairs) + 14, f"1e{decade}", "middle"))
    for position, (key, (first, second)) in enumerate(pairs.items()):
        y = top + position * row
        body.append(text(label_width - 6, y + 13, labels.get(key, key), "end"))
        for offset, value, color, what in ((2, first, MUTED_COLOR, legend[0]), (10, second, MAIN_COLOR, legend[1])):
            body.append(f'<rect class="bar" x="{label_width}" y="{y + offset:.1f}" width="{x_of(value) - label_width:.1f}" height="7" '
                        f'fill="{color}"><title>{escape(key)}: {escape(what)} {escape(sci(value))}</title></rect>')
        ratio = second / first if first else float("nan")
        body.append(text(label_width + axis_width + 8, y + 13, f"x{ratio:.3f}"))
    return svg(label_width + axis_width + 60, top + row * len(pairs) + 22, body, f"{len(pairs)} paired values")


def cosines_svg(groups: dict[str, list[float]], limit: float | None = None) -> str:
    """One bar per sample, grouped (calibration, held out), on an axis from just below the
    lowest cosine (or the limit) to 1; a bar below ``limit`` in red."""
    values = [value for group in groups.values() for value in group if not math.isnan(value)]
    floor = min(values + ([limit] if limit is not None else [])) if values else 0.0
    bottom = max(-1.0, 1 - 1.25 * (1 - floor)) if floor < 1 else 0.99
    left, top, plot_height, bar, gap = 80.0, 14.0, 150.0, 22.0, 26.0

    def y_of(value: float) -> float:
        return top + plot_height * (1 - (min(max(value, bottom), 1.0) - bottom) / (1 - bottom))

    body = [text(left - 6, top + 4, "1", "end"), text(left - 6, top + plot_height, f"{bottom:.6g}", "end")]
    x = left + 6
    for label, group in groups.items():
        start = x
        for number, value in enumerate(group):
            y = y_of(value)
            passed = limit is None or value >= limit
            body.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar - 4:.1f}" height="{top + plot_height - y:.1f}" '
                        f'fill="{MAIN_COLOR if passed else FAIL_COLOR}"><title>{escape(label)} image {number}: '
                        f"cosine {value:.8f}</title></rect>")
            x += bar
        body.append(text((start + x) / 2, top + plot_height + 16, label, "middle"))
        x += gap
    body.append(f'<line x1="{left}" y1="{top + plot_height}" x2="{x:.1f}" y2="{top + plot_height}" stroke="#444"/>')
    if limit is not None:
        y = y_of(limit)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{x:.1f}" y2="{y:.1f}" stroke="{FAIL_COLOR}" stroke-dasharray="4 3" stroke-width="1.5"/>')
        body.append(text(x + 4, y + 4, f"limit {limit:.6g}", "start", f' fill="{FAIL_COLOR}"'))
    return svg(x + 90, top + plot_height + 26, body, "cosine per image")


def stacked_bars_svg(breakdown: dict[str, dict[str, int]], colors: dict[str, str]) -> str:
    """One stacked bar per row (``breakdown``: row -> part -> bytes), on one byte scale, with
    a legend; ``colors`` gives each part's colour."""
    label_width, axis_width, row, top = 180.0, 520.0, 34.0, 8.0
    largest = max((sum(parts.values()) for parts in breakdown.values()), default=0) or 1
    body = []
    for position, (label, parts) in enumerate(breakdown.items()):
        y = top + position * row
        total = sum(parts.values()) or 1
        body.append(text(label_width - 8, y + 15, label, "end"))
        x = label_width
        for part, size in parts.items():
            width = axis_width * max(size, 0) / largest
            body.append(f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="20" '
                        f'fill="{colors.get(part, MUTED_COLOR)}">'
                        f"<title>{escape(part)}: {escape(format_bytes(size))} ({100 * size / total:.1f}%)</title></rect>")
            x += width
        body.append(text(x + 6, y + 15, format_bytes(sum(parts.values()))))
    legend_y = top + row * len(breakdown) + 6
    x = label_width
    for part in dict.fromkeys(part for parts in breakdown.values() for part in parts):
        sizes = " / ".join(format_bytes(parts[part]) for parts in breakdown.values() if part in parts)
        body.append(f'<rect x="{x:.1f}" y="{legend_y:.1f}" width="10" height="10" fill="{colors.get(part, MUTED_COLOR)}"/>')
        label = f"{part} {sizes}"
        body.append(text(x + 14, legend_y + 9, label))
        x += 30 + 6.2 * len(label)
    return svg(max(label_width + axis_width + 90, x), legend_y + 18, body, "size breakdown")
