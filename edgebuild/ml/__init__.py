"""What kinds share: ONNX tools, output comparison, images, model families, the numerics.

Imports ``core/`` only, and knows no kind: a kind imports from here, never the
other way round. Heavy libraries (torch, transformers, onnx) are imported inside
the functions that need them.
"""
