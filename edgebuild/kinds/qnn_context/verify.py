"""Verifying the QNN context: every node of the QDQ graph on QNN with CPU fallback
disabled, the context graph loadable on the HTP backend the same way, and -- for a
graph small enough for the x86 simulator -- the compiled context's output against
the QDQ graph on onnxruntime's CPU provider."""

from __future__ import annotations

import json
from typing import Any

from edgebuild.core.runner import random_feeds
from edgebuild.ml.compare import compare_outputs, worst_case
from edgebuild.plugin import Check, ExportError, NotRunnable, OutputLimits, Runner, Verification, VerifyContext

from .params import INFO_FILE, MODEL_FILE, PROVIDER, SOURCE_MODEL_FILE, SOURCE_WEIGHTS_FILE, QnnParams
from .qnn import htp_session, qnn_unavailable_reason


def verify(context: VerifyContext[QnnParams]) -> Verification:
    params = context.params
    info = json.loads((context.out_dir / INFO_FILE).read_text())
    source = context.source
    checks = [
        Check.measure("nodes_off_qnn", info["nodes_elsewhere"], "==", 0,
                      f"nodes of the compiled session not on {PROVIDER} (CPU fallback disabled); "
                      f"{info['nodes_on_qnn']} on it, from {info['source_nodes']} in the QDQ graph file"),
        Check.measure("nodes_on_qnn", info["nodes_on_qnn"], ">=", 1),
        Check.measure("qnn_partitions", len(info["partitions"]), "<=", params.verify.max_partitions),
        Check.measure("context_graph_nodes", sorted(info["context_nodes"]), "==", ["EPContext"],
                      "the compiled graph holds only EPContext nodes"),
    ]
    metrics: dict[str, Any] = {"context": info}
    unavailable = qnn_unavailable_reason()
    if unavailable is not None:
        checks.append(Check.measure("qnn_provider", "unavailable", "==", "available", unavailable))
        return Verification(checks=checks, metrics=metrics)
    try:
        session = htp_session(context.out_dir / MODEL_FILE, {}, {})
    except ExportError as error:
        checks.append(Check.measure("context_loads", False, "==", True, str(error)))
        return Verification(checks=checks, metrics=metrics)
    checks.append(Check.measure("context_loads", True, "==", True, f"on {PROVIDER} (HTP), CPU fallback disabled"))

    too_large = _too_large_to_simulate(context)
    if too_large is not None:
        metrics["simulator"] = f"skipped: {too_large}"
        return Verification(checks=checks, metrics=metrics)
    measured, comparisons = _simulate(session, source / SOURCE_MODEL_FILE, params)
    note = f"HTP simulator (soc_model {params.soc_model}) vs the QDQ graph on onnxruntime CPU, {params.verify.samples} random inputs"
    checks += [
        Check.measure("simulator.cosine", measured["cosine"], ">=", params.verify.cosine_min, note),
        Check.measure("simulator.mean_abs", measured["mean_abs"], "<=", params.verify.mean_abs, note),
        Check.measure("simulator.max_abs", measured["max_abs"], "<=", params.verify.max_abs, note),
    ]
    metrics["simulator"] = measured | {"reference": note, "samples": comparisons}
    return Verification(checks=checks, metrics=metrics)


def _simulate(session: Any, qdq_model: Any, params: QnnParams) -> tuple[dict[str, float], list[dict[str, float]]]:
    import torch

    from edgebuild.ml.onnx_tools import run_session
    from edgebuild.targets.runners import session_runner

    # The one seeded rule, its floats uniform in [-1, 1] (about the range of normalised
    # pixels, and of what the graph was calibrated on); masks all ones. Both sides run the
    # same quantized graph, so any input in the calibrated range exercises the same arithmetic.
    feeds = random_feeds(session_runner(session, "").inputs, params.verify.samples, params.verify.seed, floats="uniform")
    simulated = [session.run(None, feed) for feed in feeds]
    reference = run_session(qdq_model, feeds)
    # Every output of every sample: the worst of them decides.
    comparisons = [compare_outputs(torch.from_numpy(ref).float()[None], torch.from_numpy(out).float()[None])
                   for refs, outs in zip(reference, simulated) for ref, out in zip(refs, outs)]
    return worst_case(comparisons), comparisons


def _too_large_to_simulate(context: VerifyContext[QnnParams]) -> str | None:
    """Why the HTP simulator is not run on this context (its source's weights are over
    ``verify.simulate_max_weight_mib``), or ``None``."""
    params = context.params
    weight_mib = (context.source / SOURCE_WEIGHTS_FILE).stat().st_size / 2**20
    if weight_mib <= params.verify.simulate_max_weight_mib:
        return None
    return (f"the source's weights are {weight_mib:.1f} MiB, over verify.simulate_max_weight_mib = "
            f"{params.verify.simulate_max_weight_mib}")


# --- along the chain (edgebuild/core/runner.py) -----------------------------------------


def runner(context: VerifyContext[QnnParams]) -> Runner:
    """The compiled context on the HTP simulator (CPU fallback disabled), for a graph small
    enough to simulate; :class:`NotRunnable` otherwise."""
    from edgebuild.targets.runners import session_runner

    from .qnn import qnn_version

    params = context.params
    unavailable = qnn_unavailable_reason()
    if unavailable is not None:
        raise NotRunnable(unavailable)
    too_large = _too_large_to_simulate(context)
    if too_large is not None:
        raise NotRunnable(f"the HTP simulator is not run: {too_large}")
    try:
        session = htp_session(context.out_dir / MODEL_FILE, {}, {})
    except ExportError as error:
        raise NotRunnable(str(error)) from None
    versions = qnn_version()
    return session_runner(session, f"QNN HTP simulator (onnxruntime-qnn {versions['onnxruntime_qnn']}, QNN SDK "
                                   f"{versions['qnn_sdk']}, soc_model {params.soc_model})", simulated=True)


def float_limits(params: QnnParams, output: str) -> OutputLimits:
    """Against the float model of the chain: what an 8-bit QDQ graph holds (a 16-bit one
    holds more), with the simulator's own small error on top."""
    return OutputLimits(cosine_min=0.98)
