"""The ``litert`` manifest parameters and the files the kind writes."""

from __future__ import annotations

from typing import Literal

from edgebuild.plugin import OutputLimits
from edgebuild.targets.params import TargetParams

MODEL_FILE = "model.tflite"
INFO_FILE = "litert.json"
INFO_FORMAT = 1
EXTRA = "litert"
# The interpreter against the program it was converted from: float32 end to end
# (cosine 1.0 on the tiny encoders).
DEFAULT_LIMITS = OutputLimits(cosine_min=0.9999, max_rel=1e-3)


class LitertParams(TargetParams):
    kind: Literal["litert"]
