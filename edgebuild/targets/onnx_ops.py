"""The names an ONNX graph's op types may take: what ``never_on_cpu`` of an ONNX graph's
targets is checked against when the manifest is loaded (a misspelt op type would match
no node, and its gate would always pass)."""

from __future__ import annotations

import functools


@functools.cache
def onnx_op_types() -> frozenset[str]:
    """Every operator the ONNX standard defines (any opset, any domain onnx ships) and
    every one the installed onnxruntime registers (its contrib and quantization ops)."""
    import onnx.defs

    names = {schema.name for schema in onnx.defs.get_all_schemas_with_history()}
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state

        names |= {schema.name for schema in onnxruntime_pybind11_state.get_all_operator_schema()}
    except (ImportError, AttributeError):
        # A build of onnxruntime without its schemas: the standard's names still hold.
        pass
    return frozenset(names)
