"""Judging an artifact along its chain and on data, beside its kind's own checks.

An artifact made from a source is judged twice: by its kind, against that source (a QDQ
graph against its float graph, a QNN context against its QDQ graph), and here, against
the float model at the root of its chain -- transformers' own forward, as the root
kind's ``float_model`` gives it (or, for a root with no float model, the root's own
output) -- on the same inputs. Those checks are ``vs_float.<output>.<metric>``: what
goes to the device carries a number that says how far it is from the model that was
trained, however many steps lie between.

With ``verify: {dataset: ...}``, any artifact (a root too) is also run with the float
model of its chain on every sample of a dataset: per-sample cosines of every output,
and on a labelled set nearest-neighbour labels in the float model's embedding space
(and a classification head's own accuracy), each with a paired bootstrap 95%
interval; every gate is judged on the interval's bound (``dataset.*``).

The float model's outputs are kept by content (``cache/references``), so judging again
(a threshold moved, the artifact's runtime upgraded) runs only the artifact's side.

Every artifact that runs here is also timed (``latency.py``): its runner on one of
those inputs, and the float model of its chain in turn with it, into ``report.json``'s
``latency``; with ``verify: {latency: {max_ratio: ...}}`` the ratio of their medians is
gated (``latency.ratio``); a simulator is not timed.

Which inputs: the nearest artifact of the chain, starting with this one, whose kind
gives ``evaluation_inputs`` that fit this artifact's inputs (the held-out images of a
QDQ graph, for the QNN context made from it); else two seeded random ones. Which
kind turns images into inputs: the nearest one with ``image_feeds``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

from edgebuild.cache.references import References, digest_arrays
from edgebuild.core.datasets import dataset_files, dataset_identity
from edgebuild.core.hashing import digest_json
from edgebuild.core.kind import VerifyContext
from edgebuild.core.record import read_record_or_none
from edgebuild.core.report import Check, format_number, read_report, report_passed
from edgebuild.core.runner import Inputs, Runner, random_feeds
from edgebuild.core.thresholds import OutputLimits, PerOutputLimits, dataset_gate, latency_settings
from edgebuild.errors import CheckpointError, NotRunnable
from edgebuild.run.latency import (latency_checks, latency_line, latency_record, machine_load, not_measured,
                                  time_in_turn)

if TYPE_CHECKING:
    import numpy

    from edgebuild.core.kind import ArtifactKind
    from edgebuild.core.project import Artifact, BuildGraph
    from edgebuild.core.runner import Feed, Outputs
    from edgebuild.core.thresholds import DatasetGate, LatencySettings

Log = Callable[[str], None]

ONNX_MODEL = "model.onnx"
# Limits against the float model of the chain for a kind that names none.
GENERIC_FLOAT_LIMITS = OutputLimits(cosine_min=0.99)
RANDOM_SAMPLES = 2
# A float model's output whose spread across different inputs (statistics.spread: its
# distance from the mean output over its size) is below this ignores its input, and no
# agreement with it is evidence. Calibrated in docs/concepts/verification.md.
MIN_REFERENCE_SPREAD = 1e-3
# An output whose root mean square norm is below this vanishes (a network whose activations
# died out: randomly initialised MobileNetV2 gives logits of 1e-22): it is measured against
# this size instead, so that it reads as not varying.
VANISHING_OUTPUT = 1e-10
RANDOM_SEED = 0
REFERENCES_DIR = "references"


@dataclass
class ChainVerdict:
    """The checks this module adds, what it measured, and what ``report.json`` keeps of
    them at its top level (``chain``, ``dataset``, ``latency``)."""

    checks: list[Check] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def verify_hook(kind: "ArtifactKind", name: str) -> Callable[..., Any] | None:
    """The function ``name`` of the kind's verify module (``edgebuild/core/runner.py``
    lists them), or ``None``."""
    return getattr(importlib.import_module(kind.verify_module), name, None)


def artifact_runner(kind: "ArtifactKind", context: VerifyContext) -> Runner:
    """The built artifact, run here: its kind's ``runner``, else onnxruntime's CPU
    provider on ``model.onnx``. :class:`NotRunnable` when neither can run it."""
    hook = verify_hook(kind, "runner")
    if hook is not None:
        return hook(context)
    if ONNX_MODEL in kind.outputs:
        from edgebuild.targets.runners import onnx_runner

        return onnx_runner(context.out_dir / ONNX_MODEL)
    raise NotRunnable(f"the {kind.name} kind says nothing of how to run what it builds (no runner in "
                      f"{kind.verify_module}, and no {ONNX_MODEL} among its outputs)")


def judge_along_chain(project: "BuildGraph", artifact: "Artifact", contexts: "dict[str, VerifyContext]",
                      log: Log) -> ChainVerdict:
    """The ``vs_float.*`` checks of an artifact made from a source and the ``dataset.*``
    checks of one with a dataset gate, and what ``report.json`` records of its chain."""
    verdict = ChainVerdict()
    chain = project.lineage(artifact)
    if len(chain) > 1:
        verdict.extra["chain"] = [_ancestor_verdict(ancestor) for ancestor in chain[1:]]
    gate = dataset_gate(artifact.params)
    timing = latency_settings(artifact.params)
    context = verify_context(project, artifact, log, contexts)
    try:
        runner = artifact_runner(artifact.kind, context)
    except NotRunnable as error:
        # The kind's own policy (a simulator too slow for a graph of this size, by a limit
        # the manifest can raise): the report says it was not measured, and why.
        if len(chain) > 1 or gate is not None:
            verdict.metrics["vs_float"] = {"measured": False, "reason": str(error)}
        if gate is not None:
            verdict.checks.append(Check("dataset.ran", False, True, "==", False, f"not run here: {error}"))
        verdict.extra["latency"] = not_measured(str(error))
        verdict.checks += latency_checks(verdict.extra["latency"], timing)
        return verdict
    judge = _Judge(project, chain, contexts, runner, log)
    try:
        for wanted, prefix, judgement in ((len(chain) > 1, "vs_float", judge.versus_float),
                                          (gate is not None, "dataset", judge.on_dataset)):
            if not wanted:
                continue
            try:
                judgement(verdict)
            except NotRunnable as error:
                # The reference cannot run here: nothing says how far the artifact is from it.
                verdict.checks.append(Check(f"{prefix}.ran", False, True, "==", False, f"not run here: {error}"))
        judge.latency(verdict, timing)
    finally:
        judge.close()
    return verdict


def _ancestor_verdict(ancestor: "Artifact") -> dict[str, Any]:
    """What an ancestor's report said when this artifact was judged (its verification
    must have passed for this one to count: ``state.py``)."""
    report = read_report(ancestor.directory) or {}
    return {"artifact": ancestor.name, "kind": ancestor.params.kind, "fingerprint": report.get("fingerprint"),
            "verify_fingerprint": report.get("verify_fingerprint"), "passed": report_passed(report)}


class _Judge:
    """The float model of a chain and the artifact's runner, on inputs."""

    def __init__(self, project: "BuildGraph", chain: list["Artifact"], contexts: dict[str, VerifyContext],
                 runner: Runner, log: Log) -> None:
        self.project = project
        self.chain = chain
        self.artifact = chain[0]
        self.root = chain[-1]
        self.contexts = contexts
        self.runner = runner
        self.log = log
        self._float: Runner | None = None
        self.references = References(project.layout.cache_dir / REFERENCES_DIR, log)

    def close(self) -> None:
        self.runner.close()
        if self._float is not None and self._float is not self.runner:
            self._float.close()

    # --- the pieces ------------------------------------------------------------------

    def context(self, artifact: "Artifact") -> VerifyContext:
        return verify_context(self.project, artifact, self.log, self.contexts)

    @property
    def float_model(self) -> Runner:
        """The root kind's float model; a root with none is its own reference (its graph
        is then the float graph of the chain)."""
        if self._float is None:
            hook = verify_hook(self.root.kind, "float_model")
            if hook is not None:
                self._float = hook(self.context(self.root))
            elif self.root is self.artifact:
                raise NotRunnable(f"the {self.root.kind.name} kind names no float model to judge it against "
                                  f"(no float_model in {self.root.kind.verify_module})")
            else:
                self._float = artifact_runner(self.root.kind, self.context(self.root))
        return self._float

    def float_outputs(self, feeds: "list[Feed]") -> "list[Outputs]":
        """The float model's outputs on ``feeds``, from ``cache/references`` when they were
        computed before for the same float model and the same bytes in."""
        key = digest_json({"float": self.project.float_identity(self.root),
                           "inputs": digest_arrays((f"{index}/{name}", feed[name])
                                                   for index, feed in enumerate(feeds) for name in sorted(feed))})
        kept = self.references.get(key)
        if kept is not None:
            return kept
        outputs = self.float_model.run(feeds)
        self.references.put(key, outputs)
        return outputs

    @cached_property
    def evaluation_inputs(self) -> Inputs:
        """The nearest evaluation inputs of the chain that fit the runner; else seeded random
        ones. Once per judgement: the checks along the chain and the timing share them."""
        for found in cast(ChainInputs, self.context(self.artifact).held_out):
            if self.runner.misfit(found.feeds[0]) is None:
                return found
        return random_inputs(self.runner, RANDOM_SAMPLES, RANDOM_SEED)

    def image_feeds(self, images: list[Any], what: str) -> "list[Feed]":
        for member in self.chain:
            hook = verify_hook(member.kind, "image_feeds")
            if hook is None:
                continue
            feeds = hook(self.context(member), images)
            problem = self.runner.misfit(feeds[0]) if feeds else "no feed came of them"
            if problem is not None:
                raise CheckpointError(f"{what}: {member.name}'s image processor makes inputs this artifact does not "
                                      f"take: {problem}")
            return feeds
        raise CheckpointError(f"{what}: no kind of {self.artifact.name}'s chain turns images into its inputs "
                              "(give tensors files instead)")

    # --- the judgements --------------------------------------------------------------

    def versus_float(self, verdict: ChainVerdict) -> None:
        import numpy

        from edgebuild.ml.agreement import agreement, output_checks, worst_agreement

        inputs = self.evaluation_inputs
        actual = self.runner.run(inputs.feeds)
        reference = self.float_outputs(inputs.feeds)
        limits = _limits(self.artifact, "vs_float")
        note = f"{self.runner.description} vs {self.float_model.description} (root: {self.root.name}), {inputs.description}"
        measured: dict[str, Any] = {}
        cosines: dict[str, list[float]] = {}
        compared = [name for name in self.runner.outputs if name in reference[0]]
        if not compared:
            verdict.checks.append(Check("vs_float.outputs", sorted(self.runner.outputs), sorted(reference[0]), "==", False,
                                        "no output of the artifact is an output of the float model of its chain"))
            return
        unknown = sorted(set(limits.outputs) - set(compared))
        if unknown:
            # A limit on an output nothing compares would be dropped without a word.
            verdict.checks.append(Check("vs_float.outputs", unknown, compared, "==", False,
                                        f"verify.vs_float.outputs names {', '.join(unknown)}, which is no output both the "
                                        f"artifact and its float model give (they share: {', '.join(compared)})"))
        verdict.checks += _spread_checks("vs_float", {name: numpy.stack([expected[name] for expected in reference])
                                                      for name in compared},
                                         f"the float model of its chain (root: {self.root.name})", inputs.description)
        for name in compared:
            per_sample = [agreement(_tensor(expected[name])[None], _tensor(found[name])[None])
                          for expected, found in zip(reference, actual)]
            worst = worst_agreement(per_sample)
            measured[name] = worst
            cosines[name] = [item["cosine"] for item in per_sample]
            verdict.checks += output_checks(f"vs_float.{name}", worst,
                                            limits.for_output(name, _float_defaults(self.artifact, name)), note)
        verdict.metrics["vs_float"] = {"measured": True, "root": self.root.name, "reference": self.float_model.description,
                                       "runner": self.runner.description, "inputs": inputs.description,
                                       "outputs": measured, "cosines": cosines,
                                       "not_compared": sorted(set(self.runner.outputs) - set(compared))}

    def on_dataset(self, verdict: ChainVerdict) -> None:
        from edgebuild.ml.datasets import load_samples

        gate = dataset_gate(self.artifact.params)
        assert gate is not None

        where = self.artifact.where("verify", "dataset")
        files = dataset_files(gate, self.project.manifest.root, where)
        identity = dataset_identity(gate, files, self.project.stat_cache.file_digest)
        samples = load_samples(gate, files, self.runner.inputs)
        count = len(samples)
        if count < 2:
            raise CheckpointError(f"{where}: {samples.description}: at least 2 samples make an interval")
        feeds = samples.feeds if samples.feeds is not None else self.image_feeds(samples.images or [], where)
        self.log(f"dataset {samples.description}: {len(feeds)} runs of {self.artifact.name} and of the float model")
        actual = _per_sample(self.runner.run(feeds), count, where)
        reference = _per_sample(self.float_outputs(feeds), count, where)
        measured, checks = _dataset_gates(gate, reference, actual, samples.labels, samples.description)
        verdict.checks += _spread_checks("dataset", {name: reference[name] for name in actual if name in reference},
                                         self.float_model.description, samples.description) + checks
        verdict.extra["dataset"] = {
            "name": gate.name, "digest": digest_json(identity), "n": count, "description": samples.description,
            "reference": self.float_model.description, "runner": self.runner.description,
            "metrics": {name: interval.to_json() for name, interval in measured.items()},
        }


    def latency(self, verdict: ChainVerdict, settings: "LatencySettings") -> None:
        """The artifact's runner timed on one evaluation feed and, when its chain has a
        float source, that source timed in turn with it (``report.json``'s ``latency``).
        A simulator is not timed: its time says nothing of the device, and it is slow (the
        QNN HTP simulator takes seconds a run on the 224 tower, a minute for the timing)."""
        if self.runner.simulated:
            record = not_measured(f"{self.runner.description} simulates the device; its time says nothing of the device's")
            verdict.extra["latency"] = record | {"simulated": True}
            self.log(latency_line(verdict.extra["latency"]))
            return
        inputs = self.evaluation_inputs
        feed = inputs.feeds[0]
        try:
            reference: Runner | None = self.float_model
        except NotRunnable:
            reference = None
        if reference is self.runner:
            reference = None
        runners = [self.runner] if reference is None else [self.runner, reference]
        # Each on the same fixed threads where its runtime lets them be fixed (else its own).
        pinned = [runner.on_threads(settings.threads) if runner.on_threads is not None else runner for runner in runners]
        try:
            before = machine_load()
            timed = time_in_turn(pinned, feed, settings.runs, settings.warmup, settings.budget_s)
            load = (before, machine_load())
        finally:
            for each, runner in zip(pinned, runners):
                if each is not runner:
                    each.close()
        source = self.root.name if self.root is not self.artifact else f"{self.root.name} (its float model)"
        float_threads = pinned[1].threads if len(pinned) > 1 and pinned[1] is not runners[1] else None
        artifact = pinned[0] if pinned[0] is not runners[0] else _unpinned(self.runner)
        record = latency_record(timed[0], artifact, timed[1] if len(timed) > 1 else None,
                                source if reference is not None else None, float_threads, load)
        verdict.extra["latency"] = record
        verdict.checks += latency_checks(record, settings)
        self.log(latency_line(record))


def _unpinned(runner: Runner) -> Runner:
    """``runner`` as timed without fixed threads: whatever it says of its threads is the
    runtime's default, not a count it was held to."""
    from dataclasses import replace

    return replace(runner, threads=None)


def verify_context(project: "BuildGraph", artifact: "Artifact", log: Log,
                   contexts: "dict[str, VerifyContext]") -> VerifyContext:
    """The context ``artifact``'s kind is judged in (its built directory, its record's
    build info, its sources' parameters, the held-out inputs along its chain), made once
    per judgement and kept in ``contexts`` by name."""
    if artifact.name not in contexts:
        record = read_record_or_none(artifact.directory)
        contexts[artifact.name] = VerifyContext(
            **project.kind_inputs(artifact), out_dir=artifact.directory,
            build_info=record.build_info if record is not None else {},
            source_params={source.name: source.params for source in artifact.sources}, log=log,
            held_out=ChainInputs(project.lineage(artifact), lambda member: verify_context(project, member, log, contexts)),
        )
    return contexts[artifact.name]


def chain_inputs(chain: "list[Artifact]", context_of: "Callable[[Artifact], VerifyContext]") -> "Iterator[Inputs]":
    """The evaluation inputs (held-out images or tensors) each member of ``chain`` gives,
    nearest first, named by the member that gives them where it is not the first."""
    for member in chain:
        hook = verify_hook(member.kind, "evaluation_inputs")
        found = hook(context_of(member)) if hook is not None else None
        if found is not None and found.feeds:
            yield found if member is chain[0] else Inputs(found.feeds, f"{found.description} (of {member.name})",
                                                         found.labels)


class ChainInputs:
    """``VerifyContext.held_out`` of an artifact: called, the nearest evaluation inputs of
    its chain (``None`` without any); iterated, each member's, nearest first. Each member's
    are made once per judgement, when first asked for: the kind's own checks, the checks
    along the chain and the report's headline share them (images go through a processor,
    texts through a tokenizer, once)."""

    def __init__(self, chain: "list[Artifact]", context_of: "Callable[[Artifact], VerifyContext]") -> None:
        self._pending = chain_inputs(chain, context_of)
        self._made: list[Inputs] = []

    def __iter__(self) -> "Iterator[Inputs]":
        index = 0
        while True:
            if index == len(self._made):
                found = next(self._pending, None)
                if found is None:
                    return
                self._made.append(found)
            yield self._made[index]
            index += 1

    def __call__(self) -> Inputs | None:
        return next(iter(self), None)


def random_inputs(runner: Runner, count: int, seed: int) -> Inputs:
    """``count`` seeded inputs for the runner's signature, by the one rule
    (:func:`~edgebuild.core.runner.random_feeds`)."""
    return Inputs(random_feeds(runner.inputs, count, seed), f"{count} random inputs (seed {seed})")


def _spread_checks(prefix: str, outputs: "dict[str, numpy.ndarray]", whose: str, inputs: str) -> list[Check]:
    """``<prefix>.<output>.reference_spread``: each output of the float model (``[samples,
    ...]``) varies across the inputs it was judged on (``MIN_REFERENCE_SPREAD``). Nothing
    to say of one input."""
    import numpy

    from edgebuild.ml.statistics import spread

    checks = []
    for name, stacked in outputs.items():
        if len(stacked) < 2:
            continue
        measured = spread(stacked, VANISHING_OUTPUT)
        detail = f"{whose}'s {name} across {inputs}"
        if not measured >= MIN_REFERENCE_SPREAD:
            largest = float(numpy.abs(stacked).max())
            said = (f"{whose}'s {name} vanishes (at most {format_number(largest)} in magnitude) on every one of "
                    f"{inputs}" if largest < VANISHING_OUTPUT else f"{whose} gives nearly the same {name} for each of "
                    f"{inputs}")
            detail = (f"{said}: it ignores its input, and "
                      "agreeing with it proves nothing (a checkpoint whose weights did not load is initialised at "
                      "random: look for 'newly initialized' from transformers, and run it on two different inputs)")
        checks.append(Check.measure(f"{prefix}.{name}.reference_spread", measured, ">=", MIN_REFERENCE_SPREAD, detail))
    return checks


def _tensor(array: "numpy.ndarray") -> Any:
    import torch

    return torch.from_numpy(array.astype("float32", copy=False))


def _limits(artifact: "Artifact", key: str) -> PerOutputLimits:
    found = getattr(getattr(artifact.params, "verify", None), key, None)
    return found if isinstance(found, PerOutputLimits) else PerOutputLimits()


def _float_defaults(artifact: "Artifact", output: str) -> OutputLimits:
    """The limits against the float model of the chain that the manifest's ``vs_float``
    fills in: the kind's (``float_limits``), or, for an exact conversion of a source that
    is itself judged against float, that source's (an ORT file of a QDQ graph carries the
    QDQ graph's error, and is held to its limits)."""
    source = artifact.sources[0] if artifact.kind.exact_conversion and len(artifact.sources) == 1 else None
    if source is not None and source.sources:
        return _limits(source, "vs_float").for_output(output, _float_defaults(source, output))
    hook = verify_hook(artifact.kind, "float_limits")
    return hook(artifact.params, output) if hook is not None else GENERIC_FLOAT_LIMITS


def _per_sample(outputs: "list[Outputs]", count: int, where: str) -> "dict[str, numpy.ndarray]":
    """Each output over the samples, ``[count, ...]``: one run per sample, or runs of a
    fixed batch (the output's first axis) split into its samples."""
    import numpy

    per_run = count // len(outputs) if outputs and count % len(outputs) == 0 else 0
    stacked = {}
    for name in outputs[0]:
        values = [run[name] for run in outputs]
        if per_run == 1:
            stacked[name] = numpy.stack(values)
        elif per_run > 1 and all(value.shape[0] == per_run for value in values):
            stacked[name] = numpy.concatenate(values)
        else:
            raise CheckpointError(f"{where}: {count} samples in {len(outputs)} runs, and output {name!r} does not "
                                  "hold one row per sample")
    return stacked


def _dataset_gates(gate: "DatasetGate", reference: "dict[str, numpy.ndarray]", actual: "dict[str, numpy.ndarray]",
                   labels: list[int] | None, description: str) -> tuple[dict[str, Any], list[Check]]:
    """The intervals of every metric the set allows and the checks its gates make of them."""
    import numpy

    from edgebuild.ml.statistics import bootstrap, embeddings, nearest_labels, sample_cosines

    names = [name for name in actual if name in reference]
    series: dict[str, numpy.ndarray] = {f"{name}.cosine": sample_cosines(reference[name], actual[name]) for name in names}
    if labels is not None:
        truth = numpy.asarray(labels)
        embedding = gate.embedding or names[0]
        if embedding not in names:
            raise CheckpointError(f"dataset.embedding: {embedding!r} is not an output of the artifact "
                                  f"(its outputs: {', '.join(names)})")
        gallery = embeddings(reference[embedding])
        float_labels = nearest_labels(gallery, truth, gallery)
        artifact_labels = nearest_labels(gallery, truth, embeddings(actual[embedding]))
        series["knn_agreement"] = (artifact_labels == float_labels).astype(float)
        series["knn_accuracy_float"] = (float_labels == truth).astype(float)
        series["knn_accuracy"] = (artifact_labels == truth).astype(float)
        series["knn_drop"] = series["knn_accuracy_float"] - series["knn_accuracy"]
        if "logits" in names:
            float_top = reference["logits"].reshape(len(truth), -1).argmax(axis=1)
            artifact_top = actual["logits"].reshape(len(truth), -1).argmax(axis=1)
            series["head_agreement"] = (artifact_top == float_top).astype(float)
            series["head_accuracy_float"] = (float_top == truth).astype(float)
            series["head_accuracy"] = (artifact_top == truth).astype(float)
            series["head_drop"] = series["head_accuracy_float"] - series["head_accuracy"]
    intervals = bootstrap(series, gate.resamples, gate.seed)

    def described(name: str) -> str:
        interval = intervals[name]
        return (f"mean {format_number(interval.mean)}, 95% CI [{format_number(interval.low)}, "
                f"{format_number(interval.high)}] over {description}")

    checks = []
    if gate.min_cosine is not None:
        for name in names:
            key = f"{name}.cosine"
            checks.append(Check.measure(f"dataset.{key}", intervals[key].low, ">=", gate.min_cosine,
                                        f"lower bound; {described(key)}"))
    wants_labels = [key for key, value in (("min_agreement", gate.min_agreement), ("max_drop", gate.max_drop))
                    if value is not None]
    if wants_labels and labels is None:
        checks.append(Check("dataset.labels", "none", "labelled", "==", False,
                            f"{' and '.join(wants_labels)} need a labelled set, and {description} has no labels "
                            "(builtin: digits, labels: directory, or a 'labels' tensor)"))
        return intervals, checks
    if gate.min_agreement is not None:
        checks.append(Check.measure("dataset.knn_agreement", intervals["knn_agreement"].low, ">=", gate.min_agreement,
                                    f"lower bound; {described('knn_agreement')}"))
    if gate.max_drop is not None:
        for key in ("knn_drop", "head_drop"):
            if key in intervals:
                checks.append(Check.measure(f"dataset.{key}", intervals[key].high, "<=", gate.max_drop,
                                            f"upper bound; {described(key)}"))
    return intervals, checks
