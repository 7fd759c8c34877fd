"""Driving onnxruntime's QDQ quantizer for QNN with bounded memory.

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
``tests/test_qwen3_5_tower_qdq.py``; measured on the full-size tower too).
``entropy`` and ``percentile`` histograms are merged chunk by chunk by onnxruntime's
own collector, whose bins follow the range seen so far: their ranges can differ
slightly from a single call's, and are as deterministic (the chunk is fixed).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import numpy

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


class PatchesReader:
    """onnxruntime's ``CalibrationDataReader`` protocol over in-memory ``patches`` arrays."""

    def __init__(self, samples: list["numpy.ndarray"], input_name: str) -> None:
        self._samples = samples
        self._input_name = input_name
        self._iterator: Iterator["numpy.ndarray"] = iter(samples)

    def get_next(self) -> dict[str, "numpy.ndarray"] | None:
        sample = next(self._iterator, None)
        return None if sample is None else {self._input_name: sample}

    def __len__(self) -> int:
        return len(self._samples)


def qnn_config(model_path: Path, samples: list["numpy.ndarray"], input_name: str, activation_type: str,
               weight_type: str, per_channel: bool, calibration_method: str) -> Any:
    """onnxruntime's QDQ configuration for the QNN execution provider (reads the graph, not its weights)."""
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    types = quant_types()
    return get_qnn_qdq_config(
        str(model_path),
        PatchesReader(samples, input_name),
        calibrate_method=calibration_methods()[calibration_method],
        activation_type=types[activation_type],
        weight_type=types[weight_type],
        per_channel=per_channel,
    )


def calibrate(model_path: Path, config: Any, samples: list["numpy.ndarray"], input_name: str, scratch: Path) -> Any:
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
    for start in range(0, len(samples), CALIBRATION_CHUNK):
        calibrator.collect_data(PatchesReader(samples[start:start + CALIBRATION_CHUNK], input_name))
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

    cache = scratch / "calibration.json"
    save_tensors_data(ranges, cache)
    quantize_static(
        str(model_path),
        str(output_path),
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
