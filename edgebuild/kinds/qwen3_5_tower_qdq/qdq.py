"""Driving onnxruntime's QDQ quantizer for QNN with bounded memory.

``get_qnn_qdq_config(model, reader, ...)`` then ``quantize(model, out, config)`` is
the whole recipe; what is done here is only *when* each part holds the weights.
A plain ``quantize`` call keeps the shape-inferred float model in memory while its
calibrator loads a second copy, writes an augmented third to disk and runs it in a
session that pre-packs every MatMul weight: ~4.6x the float32 weights at peak on the
full-size tower (BENCHMARKS.md). Here the same two steps run apart:

1. calibration, with onnxruntime's own calibrator of the configured method, before
   the float model is loaded for quantizing: its session reads the augmented graph's
   weights without pre-packing them, and the inputs go in one chunk at a time, so
   the collected outputs never hold more than one image's activations;
2. ``quantize_static`` with exactly the config's arguments and the ranges of step 1
   as its calibration cache: it skips calibration and only rewrites the graph.

For ``minmax`` the ranges are the same numbers a single ``quantize`` call computes
(min of minima, max of maxima), so the graph is the same bytes (checked by
``tests/test_qwen3_5_tower_qdq.py``). ``entropy`` and ``percentile`` build their
histograms incrementally, chunk by chunk, which onnxruntime does too when handed
several batches; the chunk is one image.
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

    def rewind(self) -> None:
        self._iterator = iter(self._samples)

    def __iter__(self):
        return (self.get_next() for _ in self._samples)


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
    from onnxruntime.quantization.calibrate import create_calibrator

    options = {key: config.extra_options[name] for name, key in _CALIBRATOR_OPTIONS if name in config.extra_options}
    calibrator = create_calibrator(
        Path(model_path),
        config.op_types_to_quantize,
        augmented_model_path=(scratch / "augmented_model.onnx").as_posix(),
        calibrate_method=config.calibrate_method,
        use_external_data_format=True,
        providers=["CPUExecutionProvider"],
        extra_options=options,
    )
    # create_calibrator has opened a session that pre-packed every weight (a second
    # copy of them); reopen it without, before any input runs. The augmented graph
    # on disk was written by the calibrator, so its own model proto no longer holds
    # the weights either.
    calibrator.infer_session = None
    gc.collect()
    session_options = onnxruntime.SessionOptions()
    session_options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session_options.add_session_config_entry("session.disable_prepacking", "1")
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
