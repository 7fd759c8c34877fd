"""Options that scale a run past one process or one machine: ``--shard``, ``--dask``,
``--pull-only``, ``--remote-readonly``. What each does before doit runs the tasks:

- ``--shard I/N``: only the I-th of N shards of the selection (``edgebuild/run/shards.py``);
- ``--dask ADDRESS``: build and verify on a Dask cluster (``edgebuild/run/executors``), then
  pull everything here (``--pull-only``, implied): :func:`on_cluster`, after :func:`prepare`;
- ``--remote-readonly``: pull from the remote cache, never push (pull requests);
- ``--pull-only``: export nothing here; every artifact must come from the store or the
  remote cache (the gather step after the shards);
- ``--frozen`` (``doit verify``, ``doit publish``): ``--pull-only`` by the fingerprints of
  the lock file as committed, with no checkpoint read (``edgebuild/core/frozen.py``); only
  builds signed by a trusted key, since nothing can be judged here.

``--remote-readonly`` and ``--pull-only`` are settings of the workspace
(``remote_readonly``, ``pull_only``); the command writes them out for its worker
processes and doit's ``-n`` processes once, before doit starts them.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from doit.exceptions import InvalidCommand

from edgebuild.errors import EdgebuildError

if TYPE_CHECKING:
    from edgebuild.run.workspace import Workspace
    from edgebuild.run.scheduler import Outcomes

_REMOTE_READONLY = {
    "name": "remote_readonly", "short": "", "long": "remote-readonly", "type": bool, "default": False,
    "help": "pull from the remote cache, never push to it (pull requests; EDGEBUILD_REMOTE_CACHE_READONLY=1)",
}
_PULL_ONLY = {
    "name": "pull_only", "short": "", "long": "pull-only", "type": bool, "default": False,
    "help": "export nothing: every artifact comes from the store or the remote cache, or it is an error "
            "(the gather step after sharded builds)",
}
_FROZEN = {
    "name": "frozen", "short": "", "long": "frozen", "type": bool, "default": False,
    "help": "take every fingerprint from the lock file as committed at HEAD and pull by it: no checkpoint is "
            "read, nothing is exported or judged here; needs EDGEBUILD_TRUSTED_KEYS (EDGEBUILD_FROZEN=1)",
}
_SHARD = {
    "name": "shard", "short": "", "long": "shard", "type": str, "default": "",
    "help": "I/N: only shard I of N of the selection (an artifact with its sources; balanced by recorded cost)",
}
_DASK = {
    "name": "dask", "short": "", "long": "dask", "type": str, "default": "",
    "help": "build and verify on a Dask cluster: a scheduler address (tcp://host:8786) or 'local' / 'local:N'; "
            "needs a remote cache every worker can reach",
}
# For ``doit build`` and ``doit verify``.
RUN_OPTIONS = (_SHARD, _DASK, _REMOTE_READONLY, _PULL_ONLY)
VERIFY_OPTIONS = RUN_OPTIONS + (_FROZEN,)
# For ``doit publish`` (the gather step).
PUBLISH_OPTIONS = (_REMOTE_READONLY, _PULL_ONLY, _FROZEN)


@dataclass
class Prepared:
    """What doit is to run (dependencies first; empty: nothing), what happened to the rest
    on a cluster (``elsewhere``: the scheduler's bookkeeping), and the exit status the
    command ends with at least."""

    selected: list[str]
    status: int = 0
    elsewhere: "Outcomes | None" = None


def prepare(workspace: Workspace, params: Any, selected: list[str], verify: bool) -> Prepared:
    """Apply the scaling options to ``selected`` of ``workspace`` before doit runs it: the
    settings they stand for, and the shard. The cluster run is :func:`on_cluster`, a step
    of its own."""
    if params.get("remote_readonly"):
        workspace.configure(remote_readonly=True)
    if params.get("pull_only"):
        if workspace.remote is None:
            raise InvalidCommand("--pull-only takes every artifact from the remote cache, and none is set (EDGEBUILD_REMOTE_CACHE)")
        workspace.configure(pull_only=True)
    try:
        if params.get("frozen") or workspace.settings.frozen:
            _freeze(workspace)
        if params.get("dask"):
            from edgebuild.run.executors import check_address

            # A malformed address is refused even when there is nothing for the cluster to do.
            check_address(params["dask"])
        if params.get("shard"):
            selected = _shard(workspace, params["shard"], selected, verify)
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
        return Prepared([], 2)
    return Prepared(selected)


def on_cluster(workspace: Workspace, params: Any, prepared: Prepared) -> Prepared:
    """``--dask ADDRESS``: build and verify what ``prepared`` selects on the cluster
    (``edgebuild/run/executors``); the local run then pulls, exporting nothing, what
    succeeded there. Nothing to do without the option or with nothing selected."""
    if not params.get("dask") or not prepared.selected:
        return prepared
    from edgebuild.cli.common import handles
    from edgebuild.run.executors import run_on_cluster

    try:
        outcomes = run_on_cluster(workspace, handles(workspace, prepared.selected), params["dask"], _say)
    except EdgebuildError as error:
        print(f"edgebuild: error: {error}", file=sys.stderr, flush=True)
        return Prepared([], 2)
    # The driver only pulls what the workers pushed.
    workspace.configure(pull_only=True)
    ready = [name for name in prepared.selected if name not in outcomes.failed]
    return Prepared(ready, max(prepared.status, 1 if outcomes.failed else 0), outcomes)


def _freeze(workspace: Workspace) -> None:
    if workspace.remote is None:
        raise InvalidCommand("--frozen pulls every artifact from the remote cache, and none is set (EDGEBUILD_REMOTE_CACHE)")
    if not workspace.remote.trust.configured:
        raise InvalidCommand(
            "--frozen judges nothing here (the checkpoints need not be present), so it takes only builds signed by a "
            "trusted key, and none is set (EDGEBUILD_TRUSTED_KEYS)"
        )
    workspace.configure(frozen=True, pull_only=True)


def _shard(workspace: Workspace, text: str, selected: list[str], verify: bool) -> list[str]:
    from edgebuild.run.shards import parse_shard, select_shard

    try:
        index, count = parse_shard(text)
    except ValueError as error:
        raise InvalidCommand(str(error)) from None
    shard, basis = select_shard(workspace, selected, index, count, verify)
    print(shard.describe(basis), file=sys.stderr, flush=True)
    return list(shard.artifacts)


_SAYING = threading.Lock()


def _say(line: str) -> None:
    # One write per line, under a lock: a cluster's progress arrives on another thread.
    with _SAYING:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
