"""The ``executorch`` manifest parameters and the files the kind writes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from edgebuild.plugin import OutputLimits
from edgebuild.targets.params import TargetParams

PROGRAM_FILE = "model.pte"
INFO_FILE = "executorch.json"
INFO_FORMAT = 1
EXTRA = "executorch"
# The runtime against the program it was lowered from (and the float model): XNNPACK's
# float32 kernels agree to about 1e-7 on the tiny encoders (cosine 0.99999999).
DEFAULT_LIMITS = OutputLimits(cosine_min=0.9999, max_rel=1e-3)


class ExecutorchParams(TargetParams):
    kind: Literal["executorch"]
    delegate: Literal["xnnpack", "portable", "coreml"] = Field(
        default="xnnpack",
        description="xnnpack: XNNPACK's CPU kernels where they take a node (the rest portable); portable: "
                    "ExecuTorch's portable kernels only; coreml: Apple's Core ML delegate (built here, runs on "
                    "macOS only: verified at level loaded).",
    )
