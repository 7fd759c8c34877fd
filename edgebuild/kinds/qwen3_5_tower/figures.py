"""The tower's figures on the report page: its per-token error over the image grid and
the histogram of every output value's error (both recorded by ``verify.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import Figure, Plots, check_of, heatmap_svg, histogram_svg


def tower_figures(name: str, directory: Path, report: dict[str, Any], uid: str) -> Plots:
    plots = Plots()
    errors = report.get("metrics", {}).get("token_errors")
    if errors is None:
        plots.notes.append(f"per-token errors are not in this report (verified by an older edgebuild): "
                           f"`doit verify {name}` records them")
        return plots
    limit_check = check_of(report, "max_abs")
    limit = limit_check.get("limit") if limit_check else None
    rows, columns = errors["grid"]
    values = [float(value) for value in errors["max_abs"]]
    if rows * columns != len(values):
        raise ValueError(f"token_errors: grid {rows}x{columns} but {len(values)} tokens")
    plots.figures.append(Figure(
        f"max |error| per merged token ({rows} x {columns} grid)",
        heatmap_svg(values, rows, columns, f"{uid}-heat", limit),
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
    return plots
