"""Verification settings every kind shares: thresholds on an output's agreement with a
reference, per output, and against the float model at the root of an artifact's chain;
and gates on a dataset, judged by the bounds of bootstrap confidence intervals.

A kind's ``verify:`` model subclasses :class:`VerifySettings`, so that ``vs_float``,
``dataset`` and ``latency`` are accepted under every artifact's ``verify:`` (the engine judges them:
``edgebuild/run/chain.py``). Thresholds left unset take the kind's defaults
(:meth:`ArtifactParams.float_limits <edgebuild.core.kind.ArtifactParams.float_limits>`
for ``vs_float``); one given for a named output (``outputs: {NAME: {...}}``) wins over
the one given for every output.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from edgebuild.core.kind import TARGET_NAME, Strict

METRIC_FIELDS = ("cosine_min", "max_rel", "max_abs", "mean_abs")


class OutputLimits(Strict):
    """Limits on one output against its reference; unset ones are not checked (or take
    the kind's default)."""

    cosine_min: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Least cosine similarity of each sample's output with the reference's (the worst sample decides).",
    )
    max_rel: float | None = Field(
        default=None, ge=0.0,
        description="Largest max |output - reference| / max |reference| of the output: an error relative to its scale.",
    )
    max_abs: float | None = Field(default=None, ge=0.0, description="Largest absolute error.")
    mean_abs: float | None = Field(default=None, ge=0.0, description="Largest mean absolute error.")

    def over(self, defaults: "OutputLimits") -> "OutputLimits":
        """These limits, with ``defaults`` filling the ones left unset."""
        return OutputLimits(**{key: getattr(self, key) if getattr(self, key) is not None else getattr(defaults, key)
                               for key in METRIC_FIELDS})

    def is_empty(self) -> bool:
        return all(getattr(self, key) is None for key in METRIC_FIELDS)


class PerOutputLimits(OutputLimits):
    """Limits for every output, and for named ones (``outputs: {NAME: {...}}``), which win."""

    outputs: dict[str, OutputLimits] = Field(
        default_factory=dict,
        description="Limits for one output by name (pooler_output, last_hidden_state, ...); they win over the ones above.",
    )

    def for_output(self, name: str, defaults: OutputLimits) -> OutputLimits:
        """The limits that apply to output ``name``: its own, then these, then ``defaults``."""
        shared = OutputLimits(**{key: getattr(self, key) for key in METRIC_FIELDS}).over(defaults)
        own = self.outputs.get(name)
        return own.over(shared) if own is not None else shared


BuiltinDataset = Literal["skimage", "digits"]


class DatasetGate(Strict):
    """A gate on data: the artifact and the float model of its chain run on the same
    samples; every gate is judged on the bound of a paired bootstrap 95% interval (the
    lower bound for a least value, the upper bound for a largest one), never on the mean."""

    builtin: BuiltinDataset | None = Field(
        default=None,
        description="A set shipped inside an installed package, usable offline: skimage (the natural photos in "
                    "scikit-image's data folder) or digits (scikit-learn's 1,797 labelled 8x8 digits, upscaled).",
    )
    images: list[str] = Field(
        default_factory=list,
        description="Your own images (paths or globs, relative to the manifest), through the checkpoint's image processor.",
    )
    tensors: list[str] = Field(
        default_factory=list,
        description="Your own SafeTensors files: one tensor per graph input, named as the input ([n, ...]), and an "
                    "optional int64 'labels' tensor [n].",
    )
    labels: Literal["none", "directory"] = Field(
        default="none",
        description="For images: 'directory' takes each image's label from the name of the directory it is in.",
    )
    samples: int | None = Field(
        default=None, ge=2, le=100_000,
        description="At most this many samples, a seeded random subset (unset: all of them).",
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of the subset and of the bootstrap resampling.")
    resamples: int = Field(default=1000, ge=100, le=100_000, description="Bootstrap resamples per interval.")
    min_cosine: float | None = Field(
        default=None, ge=-1.0, le=1.0,
        description="Every output: the lower bound of the mean per-sample cosine vs the float model is at least this.",
    )
    min_agreement: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Labelled sets: the lower bound of the top-1 agreement of nearest-neighbour labels (artifact vs "
                    "float model) is at least this.",
    )
    max_drop: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Labelled sets: the upper bound of the accuracy drop (nearest-neighbour labels; a classification "
                    "head's own accuracy where the output is logits) is at most this.",
    )
    embedding: str | None = Field(
        default=None,
        description="The output whose vectors (averaged over every axis but the last) the nearest neighbours are "
                    "found in (unset: the first output).",
    )

    @model_validator(mode="after")
    def _one_source_and_a_gate(self) -> "DatasetGate":
        given = [name for name, value in (("builtin", self.builtin), ("images", self.images), ("tensors", self.tensors))
                 if value]
        if len(given) != 1:
            raise ValueError("expected exactly one of builtin, images, tensors"
                             + (f"; found {', '.join(given)}" if given else ""))
        if self.labels == "directory" and not self.images:
            raise ValueError("labels: directory takes labels from the images' directories; give images")
        if self.min_cosine is None and self.min_agreement is None and self.max_drop is None:
            raise ValueError("expected at least one gate: min_cosine, min_agreement or max_drop "
                             "(a dataset measured without a gate would only warn)")
        return self

    @property
    def name(self) -> str:
        """How reports name the data: ``builtin:digits``, ``images``, ``tensors``."""
        if self.builtin:
            return f"builtin:{self.builtin}"
        return "images" if self.images else "tensors"

    def patterns(self) -> list[str]:
        """The user's files, as written (none for a built-in set)."""
        return [*self.images, *self.tensors]


class LatencySettings(Strict):
    """How the artifact is timed here, and the opt-in gate: its median time over its float
    source's, measured in the same verification (a ratio, never an absolute time)."""

    runs: int = Field(
        default=50, ge=3, le=10_000,
        description="Timed runs, at most: the timing stops before once each median's 95% interval is within 5% "
                    "(after 10 runs); at least 3 are made.",
    )
    warmup: int = Field(default=1, ge=0, le=1000, description="Untimed runs first.")
    threads: int = Field(
        default=1, ge=1, le=1024,
        description="Threads the artifact and its float source each run on while timed (the same for both; "
                    "recorded). A runtime that cannot be pinned runs on its own choice, and no ratio is stated.",
    )
    budget_s: float = Field(
        default=5.0, gt=0.0, le=3600.0,
        description="Seconds the timing may take: it stops early once they are spent (after at least 3 timed runs).",
    )
    max_ratio: float | None = Field(
        default=None, gt=0.0,
        description="Gate (opt-in): the artifact's median time is at most this many times its float source's, "
                    "timed in turn on the same feed. Not applied to a simulator's time.",
    )


# --- Coverage: which nodes each target takes, and gates on it (edgebuild/run/coverage.py) ----
# Which targets there are is the kinds' to say (the certificates of the formats they
# produce): the manifest is checked against the artifact's kind when it is loaded (the
# ``coverage_targets`` validation context, :func:`coverage_context`).

COVERAGE_CONTEXT = "coverage_targets"


class CoverageGate(Strict):
    """Gates on one target's certificate; unset ones are not checked."""

    min_fraction: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="Least fraction of the graph's nodes the target takes (1.0: every node).",
    )
    max_partitions: int | None = Field(
        default=None, ge=0,
        description="Most partitions the nodes the target takes may form (1: one piece, no round trips to the CPU).",
    )
    never_on_cpu: list[str] = Field(
        default_factory=list,
        description="Op types (in the target's own vocabulary: ONNX op types for an ONNX graph's targets) that "
                    "must never fall back.",
    )

    @model_validator(mode="after")
    def _a_gate(self) -> "CoverageGate":
        if self.min_fraction is None and self.max_partitions is None and not self.never_on_cpu:
            raise ValueError("expected at least one gate: min_fraction, max_partitions or never_on_cpu")
        return self


class CoverageSettings(Strict):
    """Which coverage certificates an artifact gets, and gates on them, by target: any other
    key is a target's name, its value the gates on that target's certificate
    (``TARGET: {min_fraction: 0.9}``). The targets are those the artifact's kind can be
    certified for (its formats' certificates)."""

    model_config = ConfigDict(extra="allow")
    # The gates, by target, as the manifest gives them (pydantic validates each extra key's value).
    __pydantic_extra__: dict[str, CoverageGate] = Field(init=False)  # type: ignore[assignment]

    targets: list[str] | None = Field(
        default=None,
        description="The targets to certify (unset: the kind's defaults; a gated target is always certified).",
    )

    @model_validator(mode="after")
    def _known_targets(self, info: ValidationInfo) -> "CoverageSettings":
        known = (info.context or {}).get(COVERAGE_CONTEXT)
        named = [*(self.targets or ()), *self.gates()]
        for target in named:
            if not isinstance(target, str) or not TARGET_NAME.fullmatch(target):
                raise ValueError(f"expected a target's name (lower case, digits, '_'), found {target!r}")
            if known is not None and target not in known:
                hint = difflib.get_close_matches(target, list(known), n=1, cutoff=0.6)
                raise ValueError(f"unknown coverage target {target!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                                 + f"; this artifact's kind can be certified for {', '.join(known) or 'none'}")
        for target, gate in self.gates().items():
            certificate = known.get(target) if isinstance(known, dict) else None
            if gate.never_on_cpu and certificate is not None:
                _known_op_types(target, gate.never_on_cpu, certificate)
        return self

    def gates(self) -> dict[str, CoverageGate]:
        """The gated targets, in the order the manifest gives them."""
        return dict(self.__pydantic_extra__ or {})


class VerifySettings(Strict):
    """What every artifact's ``verify:`` takes beside its kind's own thresholds."""

    vs_float: PerOutputLimits = Field(
        default_factory=PerOutputLimits,
        description="Limits against the float model at the root of the artifact's chain (artifacts made from a "
                    "source); unset ones take the kind's defaults.",
    )
    dataset: DatasetGate | None = Field(
        default=None,
        description="Gates on a dataset, judged by bootstrap 95% intervals against the float model of the chain.",
    )
    latency: LatencySettings = Field(
        default_factory=LatencySettings,
        description="Timing of the artifact here (median and p90), against its float source; an opt-in ratio gate.",
    )
    coverage: CoverageSettings = Field(
        default_factory=CoverageSettings,
        description="Coverage certificates (which nodes each target takes) and gates on them, by target.",
    )


def dataset_gate(params: Any) -> DatasetGate | None:
    """An artifact's ``verify.dataset``, or ``None`` (no gate, or a kind whose ``verify:``
    does not take one)."""
    found = getattr(getattr(params, "verify", None), "dataset", None)
    return found if isinstance(found, DatasetGate) else None


def latency_settings(params: Any) -> LatencySettings:
    """An artifact's ``verify.latency`` (the defaults for a kind whose ``verify:`` has none)."""
    found = getattr(getattr(params, "verify", None), "latency", None)
    return found if isinstance(found, LatencySettings) else LatencySettings()


def coverage_settings(params: Any) -> CoverageSettings:
    """An artifact's ``verify.coverage`` (the defaults for a kind whose ``verify:`` has none)."""
    found = getattr(getattr(params, "verify", None), "coverage", None)
    return found if isinstance(found, CoverageSettings) else CoverageSettings()


def coverage_targets(kind: Any, params: Any) -> list[str]:
    """The targets certified for an artifact: the manifest's list or its kind's
    ``coverage_targets``, and every gated target, in the order the kind's formats declare
    them (any other after them, as named)."""
    settings = coverage_settings(params)
    wanted = [*(settings.targets if settings.targets is not None else kind.coverage_targets), *settings.gates()]
    order = list(kind.certificates())
    return sorted(dict.fromkeys(wanted), key=lambda target: order.index(target) if target in order else len(order))


def coverage_context(kind: Any) -> dict[str, Any]:
    """The validation context that checks ``verify.coverage``'s targets (and the op types
    their ``never_on_cpu`` names) against ``kind``'s."""
    return {COVERAGE_CONTEXT: kind.certificates()}


def _known_op_types(target: str, named: list[str], certificate: Any) -> None:
    """ValueError naming the first of ``named`` that is no op type ``certificate``'s
    target knows (a name that matches no node would make the gate pass always)."""
    known = certificate.known_op_types()
    if known is None:
        return
    for name in named:
        if name in known:
            continue
        folded = {op.casefold(): op for op in known}
        hint = folded.get(name.casefold()) or next(iter(difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)), None)
        raise ValueError(f"{target}: never_on_cpu names {name!r}, which is none of the {certificate.vocabulary}"
                         + (f" (did you mean {hint!r}?)" if hint else "") + ": it would match no node, and the gate "
                         "could never fail")
