"""Static QDQ quantization of an ONNX graph with onnxruntime's quantizer, in bounded
memory: the recipe for QNN (``get_qnn_qdq_config``) or onnxruntime's generic one, and
the checks every QDQ graph gets. Shared by every kind that quantizes a graph.

``get_qnn_qdq_config(model, reader, ...)`` then ``quantize(model, out, config)`` is
the whole recipe; what is done here is only *when* each part holds the weights.
A plain ``quantize`` call keeps the shape-inferred float model in memory while its
calibrator loads a second copy (kept resident after writing an augmented graph to
disk) and runs it in a session that pre-packs every MatMul weight: 4.5x the float32
weights at peak on the full-size tower, against 2.6x here (BENCHMARKS.md). Here the
same two steps run apart:

1. calibration, with onnxruntime's own calibrator of the configured method, before
   the float model is loaded for quantizing: its session opens only after the
   augmented graph's weights have been written out and dropped, and the inputs go in
   one chunk at a time, so the collected outputs never hold more than one image's
   activations;
2. ``quantize_static`` with exactly the config's arguments and the ranges of step 1
   as its calibration cache: it skips calibration and only rewrites the graph.

For ``minmax`` the ranges are the same numbers a single ``quantize`` call computes
(min of minima, max of maxima), so the graph is the same bytes (checked by
the tower's QDQ tests; measured on the full-size tower too).
``entropy`` and ``percentile`` histograms are merged chunk by chunk by onnxruntime's
own collector, whose bins follow the range seen so far: their ranges can differ
slightly from a single call's, and are as deterministic (the chunk is fixed).
"""

from __future__ import annotations

import gc
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from edgebuild.core.kind import ArtifactParams
from edgebuild.errors import ParameterError

if TYPE_CHECKING:
    import numpy

Feeds = dict[str, "numpy.ndarray"]
RECIPES = ("qnn", "generic")
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.onnx.data"
# What quantizing imports (the kinds' ``worker_imports``).
QUANTIZE_IMPORTS = ("onnxruntime.quantization",)
# 16-bit QuantizeLinear / DequantizeLinear exist in the ai.onnx domain from opset 21;
# below it onnxruntime falls back to com.microsoft contrib ops, which an NPU stack
# expecting standard ONNX does not take.
SIXTEEN_BIT_OPSET = 21
SIXTEEN_BIT_TYPES = frozenset({"uint16", "int16"})


def check_quantizable_source(name: str, source: ArtifactParams, activation_type: str, weight_type: str) -> None:
    """:class:`ParameterError` (with the key) for a source graph the quantizer cannot take
    with these types: one not in float32, or one below opset 21 for a 16-bit type."""
    dtype = getattr(source, "dtype", "float32")
    if dtype != "float32":
        raise ParameterError(f"source {name!r} is a {dtype} graph; expected a float32 one "
                             "(the quantizer calibrates and quantizes from float32)", key="source")
    opset = getattr(source, "opset", SIXTEEN_BIT_OPSET)
    for key, value in (("activation_type", activation_type), ("weight_type", weight_type)):
        if value in SIXTEEN_BIT_TYPES and opset < SIXTEEN_BIT_OPSET:
            raise ParameterError(
                f"{value} needs opset {SIXTEEN_BIT_OPSET} (16-bit QuantizeLinear/DequantizeLinear in ai.onnx), but "
                f"source {name!r} is exported at opset {opset}; set its opset to {SIXTEEN_BIT_OPSET}, or use an "
                f"8-bit {key}", key=key)


@dataclass(frozen=True)
class QdqOptions:
    """How to quantize: the recipe (``qnn``: onnxruntime's configuration for the QNN
    execution provider; ``generic``: ``quantize_static`` in QDQ format), the activation
    and weight types, per-channel weights, the calibration method."""

    activation_type: str = "uint16"
    weight_type: str = "uint8"
    per_channel: bool = False
    calibration_method: str = "minmax"
    recipe: str = "qnn"

# Calibration inputs per calibrator call (see the module docstring).
CALIBRATION_CHUNK = 1

# The option names of quantize_static's calibrator (its extra_options -> create_calibrator's).
_CALIBRATOR_OPTIONS = (
    ("CalibTensorRangeSymmetric", "symmetric"),
    ("CalibMovingAverage", "moving_average"),
    ("CalibMovingAverageConstant", "averaging_constant"),
    ("CalibMaxIntermediateOutputs", "max_intermediate_outputs"),
    ("CalibPercentile", "percentile"),
)


def quant_types() -> dict[str, Any]:
    from onnxruntime.quantization import QuantType

    return {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8, "uint16": QuantType.QUInt16, "int16": QuantType.QInt16}


def calibration_methods() -> dict[str, Any]:
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy, "percentile": CalibrationMethod.Percentile}


class FeedsReader:
    """onnxruntime's ``CalibrationDataReader`` protocol over in-memory inputs, one
    ``{input name: array}`` per sample."""

    def __init__(self, feeds: list[Feeds]) -> None:
        self._feeds = feeds
        self._iterator: Iterator[Feeds] = iter(feeds)

    def get_next(self) -> Feeds | None:
        return next(self._iterator, None)

    def __len__(self) -> int:
        return len(self._feeds)


def quant_config(model_path: Path, feeds: list[Feeds], options: QdqOptions) -> Any:
    """onnxruntime's static QDQ configuration for ``options.recipe`` (reads the graph,
    not its weights)."""
    from onnxruntime.quantization import QuantFormat, StaticQuantConfig
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config
    from onnxruntime.quantization.registry import QDQRegistry

    types = quant_types()
    method = calibration_methods()[options.calibration_method]
    if options.recipe == "qnn":
        return get_qnn_qdq_config(
            str(model_path),
            FeedsReader(feeds),
            calibrate_method=method,
            activation_type=types[options.activation_type],
            weight_type=types[options.weight_type],
            per_channel=options.per_channel,
        )
    if options.recipe != "generic":
        raise ValueError(f"recipe must be one of {RECIPES}, not {options.recipe!r}")
    # Every op type onnxruntime can quantize in QDQ format, named: the summary and the
    # checks compare the graph with exactly this list.
    return StaticQuantConfig(
        FeedsReader(feeds),
        calibrate_method=method,
        quant_format=QuantFormat.QDQ,
        activation_type=types[options.activation_type],
        weight_type=types[options.weight_type],
        op_types_to_quantize=sorted(QDQRegistry),
        per_channel=options.per_channel,
        extra_options={},
    )


def calibrate(model_path: Path, config: Any, feeds: list[Feeds], scratch: Path) -> Any:
    """The calibration ranges ``quantize`` would compute for ``config``, in bounded memory."""
    import onnxruntime

    calibrator = _calibrator(model_path, config, scratch / "augmented_model.onnx")
    # The calibrator wrote the augmented graph's weights to disk and dropped them (see
    # _calibrator): from here only the session below holds them. It is the session
    # quantize_static's calibrator opens (no graph optimisation, weights pre-packed as
    # usual): pre-packed MatMul kernels round differently in the last bits, so without
    # pre-packing the ranges, and the quantized bytes, would differ from quantize's.
    session_options = onnxruntime.SessionOptions()
    session_options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    calibrator.infer_session = onnxruntime.InferenceSession(
        calibrator.augmented_model_path, sess_options=session_options, providers=["CPUExecutionProvider"]
    )
    for start in range(0, len(feeds), CALIBRATION_CHUNK):
        calibrator.collect_data(FeedsReader(feeds[start:start + CALIBRATION_CHUNK]))
    ranges = calibrator.compute_data()
    calibrator.infer_session = None
    del calibrator
    gc.collect()
    return ranges


def _calibrator(model_path: Path, config: Any, augmented_path: Path) -> Any:
    """onnxruntime's calibrator for ``config``, with the graph augmented but no session yet.

    ``create_calibrator`` would also open a session at once; built here with its
    defaults for each method, so that the session is opened only after the augmented
    graph's weights have left memory."""
    import onnx
    from onnxruntime.quantization.calibrate import (
        CalibrationMethod,
        EntropyCalibrater,
        MinMaxCalibrater,
        PercentileCalibrater,
    )

    options = {key: config.extra_options[name] for name, key in _CALIBRATOR_OPTIONS if name in config.extra_options}
    common = {"op_types_to_calibrate": config.op_types_to_quantize, "augmented_model_path": augmented_path.as_posix(),
              "use_external_data_format": True}
    method = config.calibrate_method
    if method == CalibrationMethod.MinMax:
        calibrator = MinMaxCalibrater(
            Path(model_path), **common, symmetric=options.get("symmetric", False),
            moving_average=options.get("moving_average", False), averaging_constant=options.get("averaging_constant", 0.01),
            max_intermediate_outputs=options.get("max_intermediate_outputs"), per_channel=options.get("per_channel", False),
        )
    elif method == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(
            Path(model_path), **common, symmetric=options.get("symmetric", False),
            num_bins=options.get("num_bins", 128), num_quantized_bins=options.get("num_quantized_bins", 128),
        )
    elif method == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(
            Path(model_path), **common, symmetric=options.get("symmetric", True),
            num_bins=options.get("num_bins", 2048), percentile=options.get("percentile", 99.999),
        )
    else:
        raise ValueError(f"unsupported calibration method {method}")
    calibrator.augment_graph()
    # Writing the augmented graph moved its weights to disk, but the model proto keeps
    # their memory: protobuf frees a message's storage only with the whole message
    # (measured: 1.9 GiB still resident for the full-size tower). Nothing reads the
    # proto after augmenting; a weightless copy of the graph takes its place.
    calibrator.model = onnx.load(augmented_path.as_posix(), load_external_data=False)
    gc.collect()
    return calibrator


def quantize_with_ranges(model_path: Path, output_path: Path, config: Any, ranges: Any, scratch: Path) -> None:
    """``quantize(model, out, config)``, with the calibration already done: the same
    arguments to ``quantize_static``, plus the ranges as its calibration cache."""
    from onnxruntime.quantization import quantize_static
    from onnxruntime.quantization.calibrate import save_tensors_data

    from edgebuild.ml.onnx_tools import relocate_external_data

    cache = scratch / "calibration.json"
    save_tensors_data(ranges, cache)
    # onnxruntime refuses to write `<output>.data` when a file of that name is in the
    # working directory (onnx checks it there): it writes under a name no other file
    # has, and the graph then gets its real one, with the same bytes.
    written = output_path.with_name(f".{scratch.name}.{output_path.name}")
    quantize_static(
        str(model_path),
        str(written),
        None,
        calibrate_method=config.calibrate_method,
        quant_format=config.quant_format,
        activation_type=config.activation_type,
        weight_type=config.weight_type,
        op_types_to_quantize=config.op_types_to_quantize,
        nodes_to_quantize=config.nodes_to_quantize,
        nodes_to_exclude=config.nodes_to_exclude,
        per_channel=config.per_channel,
        reduce_range=config.reduce_range,
        use_external_data_format=True,
        calibration_providers=config.calibration_providers,
        extra_options=config.extra_options,
        calibration_cache_path=str(cache),
    )
    relocate_external_data(written, output_path)


def quantize_graph(source: Path, out_dir: Path, feeds: list[Feeds], options: QdqOptions, phases: Any,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Quantize ``source``'s ``model.onnx`` (with its external data) into ``out_dir``:
    configuration, chunked calibration on ``feeds``, quantization; return what the
    sidecar records (the options, the calibration, the graph's summary)."""
    from edgebuild.ml.qdq_graph import qdq_summary

    # onnxruntime writes a shape-inferred copy beside the model it is given: a copy of
    # the source graph in a scratch directory keeps it out of the source's build
    # directory (which another artifact may be reading, or quantizing, at the same time).
    with tempfile.TemporaryDirectory(prefix="qdq-", dir=out_dir.parent) as scratch_name:
        scratch = Path(scratch_name)
        float_model = scratch / MODEL_FILE
        with phases.time("copy"):
            shutil.copyfile(source / MODEL_FILE, float_model)
            shutil.copyfile(source / WEIGHTS_FILE, scratch / WEIGHTS_FILE)
        config = quant_config(float_model, feeds, options)
        with phases.time("calibrate"):
            ranges = calibrate(float_model, config, feeds, scratch)
        log(f"calibrated {len(ranges.data)} tensors ({options.calibration_method}) on {len(feeds)} inputs")
        with phases.time("quantize"):
            quantize_with_ranges(float_model, out_dir / MODEL_FILE, config, ranges, scratch)
    # onnxruntime creates the weights file owner-only; an artifact is read by others.
    (out_dir / WEIGHTS_FILE).chmod(0o644)
    with phases.time("summarize"):
        summary = qdq_summary(out_dir / MODEL_FILE, set(config.op_types_to_quantize))
    log(
        f"quantized: {summary['quantized_weights']['count']} weights, "
        f"{summary['qdq_nodes']['QuantizeLinear']} QuantizeLinear, {summary['qdq_nodes']['DequantizeLinear']} DequantizeLinear; "
        f"{len(summary['left_float'])} float tensor(s) read by computing nodes"
    )
    return {
        "recipe": options.recipe,
        "activation_type": options.activation_type,
        "weight_type": options.weight_type,
        "per_channel": options.per_channel,
        "calibration_method": options.calibration_method,
        "calibration_chunk": CALIBRATION_CHUNK,
        "calibration_inputs": len(feeds),
        "calibrated_tensors": len(ranges.data),
        "op_types_to_quantize": sorted(config.op_types_to_quantize),
        **summary,
    }
