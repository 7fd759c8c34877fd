"""The stable surface for authors of artifact kinds, built-in or from another package.

A kind is a class with a name, a summary, a pydantic ``Params`` model, the files
it writes, the formats it produces and consumes, and the modules that build and
verify it::

    from edgebuild.plugin import ONNX_GRAPH, ArtifactKind, ArtifactParams, Process, TensorSelection, VerifySettings

    ONNX_GRAPH_TARGETS = tuple(target.name for target in ONNX_GRAPH.certificates)

    class EncoderVerify(VerifySettings):     # vs_float, dataset and coverage gates, as every kind has
        cosine_min: float = 0.9999

    class EncoderParams(ArtifactParams):
        kind: Literal["my_encoder"]
        checkpoint: str
        image_size: int = 224
        verify: EncoderVerify = EncoderVerify()

    class MyEncoder(ArtifactKind[EncoderParams]):
        name = "my_encoder"
        summary = "my encoder -> fixed-shape ONNX"
        Params = EncoderParams
        outputs = ("model.onnx",)
        produces = (ONNX_GRAPH,)              # what another kind's source: may take; and the
                                              # coverage certificates of those files
        coverage_targets = ONNX_GRAPH_TARGETS  # certified by default (names of those certificates)
        build_module = "my_package.build"     # def build(context: BuildContext[EncoderParams]) -> dict
        verify_module = "my_package.verify"   # def verify(context: VerifyContext[EncoderParams]) -> Verification
                                              # (and optionally runner, float_model, ...:
                                              # edgebuild/core/runner.py)
        process = Process(memory_factor=3.0)  # how its steps run (imports first, memory)

        def tensor_selection(self, params: EncoderParams, checkpoint):
            return TensorSelection(prefixes=("vision_model.",), config_key="vision_config")

A target of its own declares a :class:`Format` that it produces, with the
:class:`CoverageTarget` whose certificate (which nodes the target takes: a
:class:`Certificate`) its files answer; the manifest then gates it like any other
(``verify: {coverage: {TARGET: {min_fraction: ...}}}``). A target that lowers a
model's ``torch.export`` program subclasses :class:`ProgramTarget` (its parameters
:class:`TargetParams`, its judgement :func:`judge_target`).

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
    CoverageTarget,
    Dtype,
    Fixture,
    Format,
    InputFiles,
    InputSet,
    Process,
    Starter,
    Strict,
    TensorSelection,
    ToolEnvironment,
    Verification,
    VerifyContext,
)
from edgebuild.core.report import Check, format_number
from edgebuild.core.runner import Feed, Inputs, Outputs, Runner, TensorSpec, random_feeds
from edgebuild.core.thresholds import CoverageGate, DatasetGate, OutputLimits, PerOutputLimits, VerifySettings
from edgebuild.core.timing import Phases
from edgebuild.errors import BuildRejected, CheckpointError, EdgebuildError, ExportError, NotRunnable, ParameterError
from edgebuild.ml.agreement import agreement, output_checks, worst_agreement
from edgebuild.targets.base import ProgramTarget
from edgebuild.targets.coverage import Certificate
from edgebuild.targets.formats import ONNX_GRAPH, QDQ_GRAPH, TORCH_PROGRAM
from edgebuild.targets.judging import judge_target
from edgebuild.targets.params import TargetParams, TargetVerify
from edgebuild.targets.runners import onnx_runner

__all__ = [
    "ONNX_GRAPH",
    "QDQ_GRAPH",
    "TORCH_PROGRAM",
    "ArtifactContext",
    "ArtifactKind",
    "ArtifactParams",
    "BuildContext",
    "BuildRejected",
    "Certificate",
    "Check",
    "Checkpoint",
    "CheckpointError",
    "CoverageGate",
    "CoverageTarget",
    "DatasetGate",
    "Dtype",
    "EdgebuildError",
    "ExportError",
    "Feed",
    "Figure",
    "Fixture",
    "Format",
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
    "Process",
    "ProgramTarget",
    "Runner",
    "Starter",
    "Strict",
    "TargetParams",
    "TargetVerify",
    "TensorSelection",
    "TensorSpec",
    "ToolEnvironment",
    "Verification",
    "VerifyContext",
    "VerifySettings",
    "agreement",
    "check_of",
    "cosines_svg",
    "expand_inputs",
    "format_bytes",
    "format_number",
    "heatmap_svg",
    "histogram_svg",
    "judge_target",
    "onnx_runner",
    "output_checks",
    "paired_log_bars_svg",
    "random_feeds",
    "read_json_file",
    "redraw_weights",
    "stacked_bars_svg",
    "worst_agreement",
]
