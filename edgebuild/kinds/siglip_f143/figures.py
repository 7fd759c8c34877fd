"""The F143 encoder's figures on the report page: the reconstruction objective per
linear (nearest rounding vs reconstructed, from ``quantization.json``) and the cosine
of each image with the float encoder's (from the report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import Figure, Plots, check_of, cosines_svg, format_number, paired_log_bars_svg, read_json_file

from .params import REPORT_FILE


def _short_linear(name: str) -> str:
    # SigLIP's linears all sit under encoder.layers.N; the layer number and the module say it all.
    return name.removeprefix("encoder.layers.").removesuffix(".weight")


def siglip_figures(name: str, directory: Path, report: dict[str, Any], uid: str) -> Plots:
    plots = Plots()
    quantization = read_json_file(directory / REPORT_FILE, plots.notes)
    if quantization is not None:
        objectives = quantization["objectives"]
        if objectives:
            plots.figures.append(Figure(
                f"reconstruction objective per linear ({len(objectives)} linears)",
                paired_log_bars_svg({linear: (float(value["nearest"]), float(value["reconstructed"]))
                                     for linear, value in objectives.items()},
                                    ("nearest F143 value", "reconstructed"),
                                    {linear: _short_linear(linear) for linear in objectives}),
                "The calibration-weighted error of rounding each weight to its nearest F143 value, and of the "
                f"reconstructed weights (log scale); the factor on the right is their ratio. Overall ratio "
                f"{format_number(quantization.get('objective_ratio'))}.",
            ))
    cosines = report.get("metrics", {}).get("image_cosines")
    if cosines is None:
        plots.notes.append(f"per-image cosines are not in this report (verified by an older edgebuild): "
                           f"`doit verify {name}` records them")
    elif any(cosines.values()):
        limit_check = check_of(report, "held_out.cosine") or check_of(report, "calibration.cosine")
        plots.figures.append(Figure(
            "cosine per image, quantized vs float encoder",
            cosines_svg({label: [float(value) for value in values] for label, values in cosines.items()},
                        limit_check.get("limit") if limit_check else None),
            "Cosine of each image's last_hidden_state with the float encoder's. Dashed red: the cosine limit.",
        ))
    return plots
