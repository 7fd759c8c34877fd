"""Where an artifact leaves float: its chain compared with the float model module by module.

``doit divergence NAME`` runs every member of the artifact's chain, from the float model
at its root (transformers' own forward) to the artifact, in its own runtime on the same
inputs (the chain's held-out inputs, else its seeded random ones: what the gates judge
on), takes the tensor at the end of each module each runtime shows (``Runner.module_outputs``:
``edgebuild/ml/taps.py``), and compares, per module in the float model's execution order:

- against float: ``cosine`` (the worst input's), ``rel_l2`` (||x - float|| / ||float||,
  the worst input's), ``max_abs``: the error this member carries, made here or before;
- against the previous member of the chain (``vs_previous_rel_l2``): the error this
  step adds (how a QDQ graph leaves its float graph, a target leaves its program);
- its own error (``local_rel_l2``): ``null`` in this release -- no runtime here runs one
  module of a built artifact alone on the float inputs of that module.

A runtime that shows no intermediate tensor (a compiled context, a delegate) is compared
at its outputs only (the row ``(outputs)``), and the hop says which modules it hides.

**The onset**: the first module, in execution order, at which a step of the chain makes
an error that matters. A step's own error at a module is its ``vs_previous_rel_l2``; it
*makes* an error there where that reaches :data:`ONSET_REL_L2` and stands out by
:data:`ONSET_JUMP`: against the median of the same module in the model's other blocks
(``encoder.layers.3.mlp`` against ``encoder.layers.*.mlp``: like against like, since a
branch's output carries a larger relative error than the residual stream it is added
to), or, for a module no other block repeats, against the largest error of any module
before it (no smaller than :data:`ERROR_FLOOR`). An error passed on grows slowly, and a
step that loses a little everywhere (8-bit quantization of a healthy model: a few
percent at every module) names no onset; a block whose MLP has outlier channels does.
The step is named by the kind that made it (``export``, ``quantization``,
``compilation``, ``conversion``: the kind's ``step``), with the module's nodes in that
member's graph where it has one.

The file, ``build/<name>/divergence.json`` (``--json`` prints it)::

    {"format": 1, "artifact": "qdq", "depth": 3, "inputs": "2 held_out inputs", "cached": false,
     "onset": {"hop": {"from": "clip", "to": "qdq", "step": "quantization"},
               "module": "encoder.layers.2.mlp", "vs_previous_rel_l2": 0.46, "rel_l2": 0.47,
               "nodes": ["node_MatMul_12", ...], "nodes_total": 18},
     "hops": [{"from": "float", "to": "clip", "step": "export", "runtime": "onnxruntime ...",
               "modules": [{"module": "embeddings", "cosine": 1.0, "rel_l2": 2.8e-07,
                            "vs_previous_rel_l2": 2.8e-07, "max_abs": 2.9e-06, "local_rel_l2": null},
                           ..., {"module": "(outputs) pooler_output", ...}],
               "hidden": {"why": "...", "modules": [...]}}, ...]}

``onset`` is ``null`` where no step makes an error by the rule above; ``hidden`` is there
only where a hop leaves modules out: ``modules`` its runtime does not show, ``untrue``
those whose tensor in the exported graph is not the module's own (where the export hop
agrees with float at the outputs but not at that module's end: the exporter moved the
module's last operation, a residual add, into another module; such a row would read as
an error the export made); ``nodes`` (at most 20 of ``nodes_total``) are the
onset module's nodes in that member's ONNX graph (none for a member without one). The file
is beside the build, never part of it: not stored, pushed or published, and a new build's
directory goes without it.

Kept like a build: ``cache/divergence/<key>.json``, keyed by every member's fingerprint
and verification fingerprint (its bytes; its held-out inputs by content), the depth and
this code's digest (``ml/taps.py`` among it: it is in no build's digest); a second run with nothing changed
computes nothing (``cached: true``). The float side runs in this process, one member at
a time, one input at a time: what is held is one member's module ends per input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.atomic import write_text
from edgebuild.core.files import UnreadableFile, read_json
from edgebuild.core.fingerprint import code_digests
from edgebuild.core.hashing import digest_json, file_digest
from edgebuild.core.record import DERIVED_FILES
from edgebuild.errors import EdgebuildError, NotRunnable
from edgebuild.ml import taps

if TYPE_CHECKING:
    import numpy

    from edgebuild.core.project import Artifact
    from edgebuild.core.runner import Feed, Runner
    from edgebuild.run.workspace import Workspace

Log = Callable[[str], None]

DIVERGENCE_FILE = DERIVED_FILES[0]
DIVERGENCE_FORMAT = 1
CACHE_DIR = "divergence"
# The default depth: every block and its direct children (``encoder.layers.3.mlp``).
DEFAULT_DEPTH = 3
MAX_DEPTH = 16
# The onset rule (see the module docstring), calibrated on 20 seeded faults and 19 clean
# chains of a 6-block tiny CLIP to 8-bit QDQ (bench/divergence_onset.py; the tests hold a
# 4-block one): a clean export stays below 1e-5 at every module; the largest step error of
# any clean chain's module was 0.228, the smallest at a seeded MLP 0.329; every seeded MLP
# stood out by more than twice against the same MLP in the blocks before it.
ONSET_REL_L2 = 0.28
ONSET_JUMP = 2.0
ERROR_FLOOR = 0.02
# A module whose tap in the exported graph is this far from float, while the graph's outputs
# agree with float within a thousandth of this, is not the module's own tensor (_drop_untrue_taps).
UNTRUE_TAP = 1e-3
EXPORT_AGREES = 1000.0
# The row of a member compared at its outputs only.
OUTPUTS_ROW = "(outputs)"
# Where a norm is this small, the relative errors are measured against this instead.
TINY_NORM = 1e-12
# Nodes named in an onset, at most.
NODES_NAMED = 20


class DivergenceError(EdgebuildError):
    """The chain cannot be compared module by module here (no torch model at its root)."""


@dataclass
class _Member:
    name: str
    step: str
    runtime: str
    ends: list[dict[str, "numpy.ndarray"]]
    outputs: list[dict[str, "numpy.ndarray"]]
    nodes: dict[str, list[str]]
    hidden: str | None


def divergence(workspace: "Workspace", artifact: "Artifact", depth: int = DEFAULT_DEPTH,
               log: Log = lambda line: None) -> dict[str, Any]:
    """The divergence of ``artifact`` (built) along its chain, from the cache when it was
    computed before for the same builds, inputs and depth; also written to
    ``build/<name>/divergence.json``."""
    from edgebuild.run.chain import ChainInputs, artifact_runner, random_inputs, verify_context, verify_hook
    from edgebuild.run.state import current_record

    chain = workspace.lineage(artifact)
    for member in reversed(chain):
        if current_record(workspace, member) is None:
            which = "it" if member is artifact else member.name
            raise DivergenceError(f"{artifact.name}: {which} is not built at its current fingerprint; "
                                  f"`doit build {artifact.name}` first")
    contexts: dict[str, Any] = {}
    root = chain[-1]
    float_hook = verify_hook(root.kind, "float_model")
    if float_hook is None:
        raise DivergenceError(f"{artifact.name}: its chain has no torch model at its root ({root.name}, kind "
                              f"{root.kind.name}, names no float model): divergence compares with one")
    # Keyed without running anything: the members' fingerprints (their bytes) and
    # verification fingerprints (the held-out inputs by content, the judging code).
    key = digest_json({"chain": [[member.fingerprint, member.verify_fingerprint] for member in chain],
                       "depth": depth, "code": code_digests(__name__, "edgebuild.ml.modules"),
                       "taps": file_digest(Path(taps.__file__))})
    cached = _cached(workspace, key)
    if cached is not None:
        result = {**cached, "cached": True}
        write_text(artifact.directory / DIVERGENCE_FILE, json.dumps(result, indent=2, sort_keys=True) + "\n")
        return result
    float_model = float_hook(verify_context(workspace, root, log, contexts))
    try:
        if float_model.module_outputs is None:
            raise DivergenceError(f"{artifact.name}: the float model of its chain ({float_model.description}) shows no "
                                  "module's tensors")
        inputs = next((found for found in ChainInputs(chain, lambda member: verify_context(workspace, member, log, contexts))
                       if float_model.misfit(found.feeds[0]) is None), None) or random_inputs(float_model, 2, 0)
        members = [_float_member(float_model, inputs.feeds, depth)]
        float_paths = set(members[0].ends[0])
        for member in reversed(chain):
            runner = artifact_runner(member.kind, verify_context(workspace, member, log, contexts))
            try:
                log(f"divergence: running {member.name} ({runner.description})")
                members.append(_artifact_member(member, runner, inputs.feeds, depth, float_paths))
            finally:
                runner.close()
        result = _compare(artifact.name, members, inputs.description, depth)
        _keep(workspace, key, result)
        result = {**result, "cached": False}
    except NotRunnable as error:
        raise DivergenceError(f"{artifact.name}: {error}") from None
    finally:
        float_model.close()
    write_text(artifact.directory / DIVERGENCE_FILE, json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def _float_member(runner: "Runner", feeds: "list[Feed]", depth: int) -> _Member:
    ends, outputs = [], []
    for feed in feeds:
        assert runner.module_outputs is not None
        ends.append(_to_depth(runner.module_outputs(feed), depth))
        outputs.append(runner.run_one(feed))
    return _Member("float", "", runner.description, ends, outputs, {}, None)


def _artifact_member(member: "Artifact", runner: "Runner", feeds: "list[Feed]", depth: int,
                     float_paths: set[str]) -> _Member:
    outputs = [runner.run_one(feed) for feed in feeds]
    hidden = None
    ends: list[dict[str, Any]] = [{} for _ in feeds]
    if runner.module_outputs is None:
        hidden = f"{runner.description} shows no module's tensors: compared at its outputs only"
    else:
        ends = [_to_depth(_as_float_paths(runner.module_outputs(feed), float_paths), depth) for feed in feeds]
    return _Member(member.name, member.kind.step, runner.description, ends, outputs,
                   _as_float_paths(_graph_nodes(member), float_paths), hidden)


def _as_float_paths(found: dict[str, Any], float_paths: set[str]) -> dict[str, Any]:
    """``found`` by the float model's module paths: a graph exported through a wrapper of
    its own names its modules under the wrapper's attribute (``tower.blocks.0``), which
    is left off until the path is one the float model has; a module it has none of is left out."""
    renamed = {}
    for path, value in found.items():
        candidate = path
        while candidate and candidate not in float_paths:
            candidate = candidate.partition(".")[2]
        if candidate:
            renamed.setdefault(candidate, value)
    return renamed


def _graph_nodes(member: "Artifact") -> dict[str, list[str]]:
    """Each module's nodes in the member's ONNX graph (none for a member without one)."""
    path = member.directory / "model.onnx"
    if not path.is_file():
        return {}
    import onnx

    from edgebuild.ml.taps import graph_module_ends

    return {module: nodes for module, (_, nodes) in graph_module_ends(onnx.load(str(path), load_external_data=False)).items()}


def _to_depth(ends: "dict[str, numpy.ndarray]", depth: int) -> "dict[str, numpy.ndarray]":
    from edgebuild.ml.taps import module_depth

    return {module: value for module, value in ends.items() if module_depth(module) <= depth}


def _errors(actual: "numpy.ndarray", reference: "numpy.ndarray") -> tuple[float, float, float]:
    """(cosine, relative L2 error, max abs error) of one tensor against its reference."""
    import numpy

    a = numpy.asarray(actual, dtype=numpy.float64).ravel()
    r = numpy.asarray(reference, dtype=numpy.float64).ravel()
    difference = numpy.linalg.norm(a - r)
    norm_r, norm_a = numpy.linalg.norm(r), numpy.linalg.norm(a)
    cosine = float(a @ r / (norm_a * norm_r)) if norm_a > TINY_NORM and norm_r > TINY_NORM else float(difference == 0)
    return cosine, float(difference / max(norm_r, TINY_NORM)), float(numpy.max(numpy.abs(a - r))) if a.size else 0.0


def _row(module: str, values: "list[numpy.ndarray]", floats: "list[numpy.ndarray]",
         previous: "list[numpy.ndarray] | None") -> dict[str, Any] | None:
    if any(value.size != reference.size for value, reference in zip(values, floats)):
        return None
    measured = [_errors(value, reference) for value, reference in zip(values, floats)]
    row: dict[str, Any] = {
        "module": module,
        "cosine": min(cosine for cosine, _, _ in measured),
        "rel_l2": max(rel for _, rel, _ in measured),
        "max_abs": max(worst for _, _, worst in measured),
        "vs_previous_rel_l2": None,
        "local_rel_l2": None,
    }
    if previous is not None and all(value.size == before.size for value, before in zip(values, previous)):
        row["vs_previous_rel_l2"] = max(_errors(value, before)[1] for value, before in zip(values, previous))
    return row


def _compare(name: str, members: list[_Member], inputs: str, depth: int) -> dict[str, Any]:
    float_member = members[0]
    order = list(float_member.ends[0])
    hops = []
    for previous, member in zip(members, members[1:]):
        modules = []
        for module in order:
            if not all(module in ends for ends in member.ends):
                continue
            before = [ends[module] for ends in previous.ends] if all(module in ends for ends in previous.ends) else None
            row = _row(module, [ends[module] for ends in member.ends], [ends[module] for ends in float_member.ends],
                       before)
            if row is not None:
                modules.append(row)
        for output in float_member.outputs[0]:
            if all(output in outputs for outputs in member.outputs):
                row = _row(f"{OUTPUTS_ROW} {output}", [outputs[output] for outputs in member.outputs],
                           [outputs[output] for outputs in float_member.outputs],
                           [outputs[output] for outputs in previous.outputs]
                           if all(output in outputs for outputs in previous.outputs) else None)
                if row is not None:
                    modules.append(row)
        shown = {row["module"] for row in modules}
        hidden_modules = [module for module in order if module not in shown]
        hop: dict[str, Any] = {"from": previous.name, "to": member.name, "step": member.step,
                               "runtime": member.runtime, "modules": modules}
        if member.hidden is not None or hidden_modules:
            hop["hidden"] = {"why": member.hidden or "not shown by this runtime at the float model's module ends",
                             "modules": hidden_modules}
        hops.append(hop)
    _drop_untrue_taps(hops)
    return {"format": DIVERGENCE_FORMAT, "artifact": name, "depth": depth, "inputs": inputs,
            "onset": _onset(hops, members), "hops": hops}


def _drop_untrue_taps(hops: list[dict[str, Any]]) -> None:
    """Leave out of every hop the modules whose tensor in the exported graph is not the
    module's own: where the export keeps the float model's outputs (to :data:`EXPORT_AGREES`
    of their error) but a module's end is far from the float model's, the exporter moved
    that module's last operation into another (a residual add fused into a projection), and
    its row would read as an error the export made."""
    first = hops[0] if hops else None
    if first is None or first["from"] != "float" or first["step"] != "export":
        return
    outputs = [row["rel_l2"] for row in first["modules"] if row["module"].startswith(OUTPUTS_ROW)]
    if not outputs:
        return
    limit = max(UNTRUE_TAP, EXPORT_AGREES * max(outputs))
    untrue = {row["module"] for row in first["modules"]
              if not row["module"].startswith(OUTPUTS_ROW) and row["rel_l2"] > limit}
    if not untrue:
        return
    for hop in hops:
        hop["modules"] = [row for row in hop["modules"] if row["module"] not in untrue]
        hidden = hop.setdefault("hidden", {"why": "", "modules": []})
        hidden["untrue"] = sorted(untrue)
        hidden["untrue_why"] = ("the graph's tensor at these modules' ends is not the module's own output (the export "
                                "moved its last operation into another module)")


def _role(module: str) -> str:
    """A module's place in a block, whichever block: ``encoder.layers.*.mlp``."""
    return ".".join("*" if part.isdigit() else part for part in module.split("."))


def made_error(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first of one step's ``rows`` (execution order) at which it makes an error, by
    the onset rule (module docstring); ``None`` where none does."""
    import statistics

    own = [(row, row["vs_previous_rel_l2"]) for row in rows
           if row["vs_previous_rel_l2"] is not None and not row["module"].startswith(OUTPUTS_ROW)]
    by_role: dict[str, list[float]] = {}
    for row, error in own:
        if _role(row["module"]) != row["module"]:
            by_role.setdefault(_role(row["module"]), []).append(error)
    seen: dict[str, list[float]] = {}
    largest = ERROR_FLOOR
    for row, error in own:
        role = _role(row["module"])
        peers = by_role.get(role, [])
        before = seen.setdefault(role, [])
        if len(peers) >= 3:
            # Its peers in the blocks before it, where there are any: those after carry
            # what this one passes on.
            baseline = max(ERROR_FLOOR, statistics.median(before or [peer for peer in peers if peer is not error]))
            before.append(error)
        else:
            baseline = largest
        if error >= ONSET_REL_L2 and error >= ONSET_JUMP * baseline:
            return row
        largest = max(largest, error)
    return None


def _onset(hops: list[dict[str, Any]], members: list[_Member]) -> dict[str, Any] | None:
    """The first module, in execution order, at which a step makes its error (module docstring)."""
    order = {module: position for position, module in enumerate(members[0].ends[0])}
    found = []
    for index, hop in enumerate(hops):
        row = made_error(hop["modules"])
        if row is not None:
            found.append((order.get(row["module"], len(order)), index, row))
    if not found:
        return None
    _, index, row = min(found, key=lambda item: (item[0], item[1]))
    hop = hops[index]
    nodes = members[index + 1].nodes.get(row["module"], [])
    return {"hop": {"from": hop["from"], "to": hop["to"], "step": hop["step"]}, "module": row["module"],
            "vs_previous_rel_l2": row["vs_previous_rel_l2"], "rel_l2": row["rel_l2"],
            "nodes": nodes[:NODES_NAMED], "nodes_total": len(nodes)}


def _cached(workspace: "Workspace", key: str) -> dict[str, Any] | None:
    try:
        found = read_json(workspace.layout.cache_dir / CACHE_DIR / f"{key}.json", 64 << 20)
    except (OSError, UnreadableFile):
        return None
    return found if isinstance(found, dict) and found.get("format") == DIVERGENCE_FORMAT else None


def _keep(workspace: "Workspace", key: str, result: dict[str, Any]) -> None:
    directory = workspace.layout.cache_dir / CACHE_DIR
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_text(directory / f"{key}.json", json.dumps(result, sort_keys=True) + "\n")
    except OSError:
        # A cache: computed again next time.
        pass


def render(result: dict[str, Any], limit: int = 40) -> list[str]:
    """The divergence as lines: the onset, then per hop its modules' errors."""
    lines = [f"{result['artifact']}: divergence from float on {result['inputs']} (depth {result['depth']}"
             f"{', cached' if result.get('cached') else ''})"]
    onset = result.get("onset")
    if onset is None:
        lines.append("  onset: none (no step makes an error at a module by the onset rule)")
    else:
        hop = onset["hop"]
        nodes = ", ".join(onset["nodes"][:5]) + (f" and {onset['nodes_total'] - 5} more" if onset["nodes_total"] > 5 else "")
        lines.append(f"  onset: {onset['module']}, made by {hop['from']} -> {hop['to']} ({hop['step'] or 'its step'}): "
                     f"its own error there {onset['vs_previous_rel_l2']:.4g}" + (f"; nodes {nodes}" if nodes else ""))
    for hop in result["hops"]:
        lines.append(f"  {hop['from']} -> {hop['to']} ({hop['step']}, {hop['runtime']})")
        lines.append(f"    {'module':<44} {'cosine':>9} {'rel_l2':>9} {'vs_prev':>9} {'max_abs':>9}")
        for row in hop["modules"][:limit]:
            previous = "-" if row["vs_previous_rel_l2"] is None else f"{row['vs_previous_rel_l2']:.3g}"
            lines.append(f"    {row['module']:<44} {row['cosine']:>9.5f} {row['rel_l2']:>9.3g} {previous:>9} "
                         f"{row['max_abs']:>9.3g}")
        if len(hop["modules"]) > limit:
            lines.append(f"    ... and {len(hop['modules']) - limit} more (--json has every one)")
        hidden = hop.get("hidden") or {}
        if hidden.get("modules"):
            lines.append(f"    hidden: {len(hidden['modules'])} modules ({hidden['why']})")
        if hidden.get("untrue"):
            lines.append(f"    left out: {', '.join(hidden['untrue'])} ({hidden['untrue_why']})")
    return lines
