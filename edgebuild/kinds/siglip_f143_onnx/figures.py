"""The FP8 graph's figures on the report page: its size against the same graph with
float weights (from ``export.json`` and the report), and the cosine of each image's
output with the float encoder's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import Figure, Plots, check_of, cosines_svg, format_bytes, read_json_file, stacked_bars_svg

from .params import INFO_FILE

PART_COLORS = {"FP8 codes": "#2f6fb0", "scales": "#f0a030", "quantized weights": "#9aa3ad", "everything else": "#d5dae0"}


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
        ratio_check = check_of(report, "quantized_weight_ratio")
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


def onnx_figures(name: str, directory: Path, report: dict[str, Any], uid: str) -> Plots:
    plots = Plots()
    export = read_json_file(directory / INFO_FILE, plots.notes)
    if export is not None:
        breakdown = fp8_size_breakdown(export, report)
        if breakdown is not None:
            plots.figures.append(Figure(
                "graph size: FP8 weights vs float weights",
                stacked_bars_svg(breakdown, PART_COLORS),
                "model.onnx with its external data. The quantized linears' weights become one byte of FP8 code "
                "per weight and a float32 scale per 64 inputs; everything else (other weights, the graph) stays.",
            ))
        else:
            plots.notes.append(f"graph {format_bytes(export['graph_bytes'])} vs {format_bytes(export['float_graph_bytes'])} "
                               "with float weights (no FP8 weights to break down)")
    float_metrics = report.get("metrics", {}).get("vs_float")
    cosines = float_metrics.get("cosines", {}).get("last_hidden_state") if isinstance(float_metrics, dict) else None
    if cosines:
        limit_check = check_of(report, "vs_float.last_hidden_state.cosine")
        plots.figures.append(Figure(
            "cosine per image, onnxruntime vs float encoder",
            cosines_svg({str(float_metrics.get("inputs", "inputs")): [float(value) for value in cosines]},
                        limit_check.get("limit") if limit_check else None),
            "Cosine of each image's last_hidden_state from the FP8 graph with the float encoder's. "
            "Dashed red: the cosine limit.",
        ))
    return plots
