"""The environment LiteRT's converter runs in when it cannot run in edgebuild's.

``litert-torch`` 0.10 (the one release for torch 2.13) pins ``litert-converter`` 0.5,
which pins ``xdsl`` 0.28, which wants ``typing-extensions`` below 4.13; model-signing
(signed releases) wants 4.14.1 or later. So the converter runs in a virtual environment
beside edgebuild's, with the same torch (a ``torch.export`` program loads only in the
torch that saved it): ``python -m edgebuild toolenv litert`` makes it (``.venv-litert``
beside the environment edgebuild runs in, or where ``EDGEBUILD_LITERT_PYTHON`` says), and
the build runs ``convert.py`` there. Where the converter imports in edgebuild's own
environment, it runs there instead.
"""

from __future__ import annotations

import importlib.util

from edgebuild.plugin import ToolEnvironment

LITERT_CONVERTER = ToolEnvironment(
    name="litert",
    # torch as edgebuild pins it: the program the converter loads was saved by that torch;
    # ml_dtypes as edgebuild pins it (pyproject.toml: 0.7.0 takes 1.1 s to import).
    packages=("torch==2.13.0", "litert-torch==0.10.0", "ai-edge-litert==2.3.0", "ml_dtypes==0.6.*"),
    module="litert_torch",
    directory=".venv-litert",
    versions=("litert-torch", "litert-converter", "torch"),
)


def converter_here() -> bool:
    """Whether litert-torch imports in edgebuild's own environment."""
    return importlib.util.find_spec(LITERT_CONVERTER.module) is not None
