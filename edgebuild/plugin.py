"""The stable surface for authors of artifact kinds, built-in or from another package.

A kind is a class with a name, a summary, a pydantic ``Params`` model, the files
it writes and the modules that build and verify it::

    from edgebuild.plugin import ArtifactKind, ArtifactParams, TensorSelection, VerifySettings

    class EncoderVerify(VerifySettings):     # vs_float and dataset gates, as every kind has
        cosine_min: float = 0.9999

    class EncoderParams(ArtifactParams):
        kind: Literal["my_encoder"]
        checkpoint: str
        image_size: int = 224
        verify: EncoderVerify = EncoderVerify()

    class MyEncoder(ArtifactKind):
        name = "my_encoder"
        summary = "my encoder -> fixed-shape ONNX"
        Params = EncoderParams
        outputs = ("model.onnx",)
        build_module = "my_package.build"     # def build(context: BuildContext) -> dict
        verify_module = "my_package.verify"   # def verify(context: VerifyContext) -> Verification
                                              # (and optionally runner, float_model, ...:
                                              # edgebuild/core/runner.py)

        def tensor_selection(self, params, checkpoint):
            return TensorSelection(prefixes=("vision_model.",), config_key="vision_config")

and one entry point in the plugin's ``pyproject.toml``::

    [project.entry-points."edgebuild.kinds"]
    my_encoder = "my_package:MyEncoder"

The code digests of a plugin kind follow its build and verify modules' imports
inside edgebuild and the plugin's own package (and ``code_packages``); what a
module imports from here is followed to the module that defines it, so this
facade itself is in no fingerprint. ``edgebuild.testing`` has the contract checks
a plugin's own tests run. Everything else in edgebuild may change between
releases; what is named here changes only with a changelog entry.
"""

from __future__ import annotations

from edgebuild.core.checkpoint import Checkpoint
from edgebuild.core.figures import (
    Figure,
    Plots,
    check_of,
    cosines_svg,
    format_bytes,
    heatmap_svg,
    histogram_svg,
    paired_log_bars_svg,
    read_json_file,
    stacked_bars_svg,
)
from edgebuild.core.fixtures import redraw_weights
from edgebuild.core.inputs import expand_inputs
from edgebuild.core.kind import (
    ArtifactContext,
    ArtifactKind,
    ArtifactParams,
    BuildContext,
    Dtype,
    Fixture,
    InputFiles,
    InputSet,
    Starter,
    Strict,
    TensorSelection,
    Verification,
    VerifyContext,
)
from edgebuild.core.report import Check, format_number
from edgebuild.core.runner import Feed, Inputs, Outputs, Runner, TensorSpec
from edgebuild.core.thresholds import DatasetGate, OutputLimits, PerOutputLimits, VerifySettings
from edgebuild.core.timing import Phases
from edgebuild.errors import BuildRejected, CheckpointError, EdgebuildError, ExportError, NotRunnable, ParameterError

__all__ = [
    "ArtifactContext",
    "ArtifactKind",
    "ArtifactParams",
    "BuildContext",
    "BuildRejected",
    "Check",
    "Checkpoint",
    "CheckpointError",
    "DatasetGate",
    "Dtype",
    "EdgebuildError",
    "ExportError",
    "Feed",
    "Figure",
    "Fixture",
    "InputFiles",
    "InputSet",
    "Inputs",
    "NotRunnable",
    "OutputLimits",
    "Outputs",
    "ParameterError",
    "PerOutputLimits",
    "Phases",
    "Plots",
    "Runner",
    "Starter",
    "Strict",
    "TensorSelection",
    "TensorSpec",
    "Verification",
    "VerifyContext",
    "VerifySettings",
    "check_of",
    "cosines_svg",
    "expand_inputs",
    "format_bytes",
    "format_number",
    "heatmap_svg",
    "histogram_svg",
    "paired_log_bars_svg",
    "read_json_file",
    "redraw_weights",
    "stacked_bars_svg",
]
