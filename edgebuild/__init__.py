"""edgebuild: a declarative build system for model artifacts shipped to edge devices.

The package imports nothing heavy at import time (torch, transformers and
onnxruntime are imported inside the functions that need them) so that
``doit list`` stays instant.
"""

__version__ = "0.1.0"
