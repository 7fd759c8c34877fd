"""Shards for CI matrices: ``doit build --shard I/N``, ``doit verify --shard I/N``.

The selection (the artifacts named, or all, with everything they consume) is
cut into groups that must stay together -- an artifact, its ``source`` chain, and
every other artifact built from the same sources, since a build reads its
sources' directories -- and the groups are dealt to N shards so that every
artifact is in exactly one.

The partition is a function of committed state alone -- the manifest and the lock
file as committed at ``HEAD`` -- so every shard job of a CI run computes the same one
without talking to the others, and a second shard run in the checkout where the first
rewrote the lock file computes the same one too:

- cost: recorded wall time (build, plus verification for ``verify``) from the
  committed lock file (``run/costs.py``), never from local build records; an
  artifact without history counts as the mean of those with some, and with no
  history at all (or no committed lock file) every artifact counts as 1 (balanced by count);
- order: the costliest group first (the longest-processing-time rule: no shard
  ends more than one group's cost above the best split), ties broken by a blake3
  hash of the group's names -- stable across machines, Python versions and
  manifest order, unlike ``hash()`` or dict order;
- each group goes to the shard with the least cost so far (the lowest index on a tie).

The gather step still checks that every artifact arrived (``--pull-only`` names what
no shard pushed) rather than rebuilding it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgebuild.core.hashing import digest_bytes

if TYPE_CHECKING:
    from edgebuild.run.costs import Cost
    from edgebuild.core.manifest import Manifest
    from edgebuild.run.workspace import Workspace


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based, as written on the command line
    count: int
    artifacts: tuple[str, ...]  # dependencies first
    cost: float  # the balancing cost (seconds, or artifacts when no history)
    total: float  # the whole selection's

    def describe(self, basis: str) -> str:
        names = ", ".join(self.artifacts) if self.artifacts else "none"
        return f"shard {self.index}/{self.count}: {len(self.artifacts)} artifacts ({names}); {basis}"


# More shards than any CI matrix runs (GitHub's caps a matrix at 256 jobs); the
# partition holds one list per shard, so N is bounded before anything is allocated.
MAX_SHARDS = 1024


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``; ``ValueError`` saying what was expected. ASCII digits
    only (``\\d`` would take ``１/２``), N at most :data:`MAX_SHARDS`."""
    match = re.fullmatch(r"[ \t]*([0-9]{1,20})[ \t]*/[ \t]*([0-9]{1,20})[ \t]*", text)
    if not match:
        raise ValueError(f"--shard: expected I/N such as 1/2 (shard I of N, ASCII digits), found {text!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count > MAX_SHARDS:
        raise ValueError(f"--shard: expected N at most {MAX_SHARDS}, found {index}/{count}")
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"--shard: expected 1 <= I <= N, found {index}/{count}")
    return index, count


def groups(manifest: "Manifest", names: list[str]) -> list[list[str]]:
    """``names`` and what they consume, as the groups that must share a shard: the
    connected parts of the source graph, each in dependency order."""
    selection = manifest.order(names)
    parent = {name: name for name in selection}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for name in selection:
        for source in manifest.artifacts[name].source_artifacts():
            parent[root(name)] = root(source)
    members: dict[str, list[str]] = {}
    for name in selection:
        members.setdefault(root(name), []).append(name)
    return list(members.values())


def partition(group_list: list[list[str]], costs: dict[str, "Cost | None"], count: int, verify: bool) -> list[list[str]]:
    """Deal ``group_list`` to ``count`` shards, balancing the recorded cost; see the module."""
    return [artifacts for artifacts, _ in _dealt(group_list, costs, count, verify)[0]]


def _dealt(
    group_list: list[list[str]], costs: dict[str, "Cost | None"], count: int, verify: bool
) -> tuple[list[tuple[list[str], float]], str]:
    known = {name: seconds for name, cost in costs.items() if cost is not None and (seconds := cost.seconds(verify)) is not None}
    everyone = [name for group in group_list for name in group]
    if known:
        fallback = sum(known.values()) / len(known)
        weight = {name: known.get(name, fallback) for name in everyone}
        with_history = sum(1 for name in everyone if name in known)
        basis = f"balanced by recorded seconds ({with_history} of {len(everyone)} artifacts have history)"
    else:
        weight = {name: 1.0 for name in everyone}
        basis = "no recorded costs: balanced by artifact count, in a stable hash order"
    ordered = sorted(group_list, key=lambda group: (-sum(weight[name] for name in group), _stable_key(group)))
    shards: list[tuple[list[str], float]] = [([], 0.0) for _ in range(count)]
    for group in ordered:
        target = min(range(count), key=lambda index: (shards[index][1], index))
        artifacts, load = shards[target]
        shards[target] = (artifacts + group, load + sum(weight[name] for name in group))
    return shards, basis


def _stable_key(group: list[str]) -> str:
    return digest_bytes("\n".join(sorted(group)).encode())


def select_shard(workspace: "Workspace", names: list[str], index: int, count: int, verify: bool) -> tuple[Shard, str]:
    """Shard ``index`` of ``count`` of ``names`` (and what they consume), and a line saying
    how the partition was balanced."""
    from edgebuild.run.costs import committed_costs

    group_list = groups(workspace.manifest, names)
    everyone = [name for group in group_list for name in group]
    costs, missing = committed_costs(workspace, everyone)
    dealt, basis = _dealt(group_list, costs, count, verify)
    unit = "s" if basis.startswith("balanced by recorded") else " artifacts"
    if missing is not None:
        basis = f"{missing}: {basis}"
    artifacts, load = dealt[index - 1]
    total = sum(share for _, share in dealt)
    # Dependency order within the shard, as the manifest gives it.
    ordered = tuple(workspace.manifest.order(artifacts))
    shard = Shard(index, count, ordered, load, total)
    return shard, f"{basis}; this shard {load:.4g}{unit} of {total:.4g}{unit}"
