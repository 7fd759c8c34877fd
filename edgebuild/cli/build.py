"""``doit build [ARTIFACT ...]``: doit's own ``run`` with the task selection translated
from artifact names, so every ``run`` option (``-n 2``, ``--continue``, ``-v 2``)
keeps working; then the lock file is refreshed for what is built."""

from __future__ import annotations

from doit.cmd_run import Run

from edgebuild.cli.common import NamesAnywhere, open_workspace, run_and_lock, selected
from edgebuild.cli.options import RUN_OPTIONS, on_cluster, prepare


class Build(NamesAnywhere, Run):
    name = "build"
    doc_purpose = "build artifacts (all, or the ones named) and what they depend on"
    doc_usage = "[--shard I/N] [--dask ADDRESS] [ARTIFACT ...]"
    doc_description = (
        "Rebuilds only what is stale; up-to-date artifacts are skipped. Refreshes the lock file "
        "(<manifest stem>.lock) for what is built."
    )
    cmd_options = Run.cmd_options + RUN_OPTIONS

    def execute(self, params, args):  # noqa: D102 - doit's signature
        workspace = open_workspace(self, params)
        prepared = on_cluster(workspace, params, prepare(workspace, params, selected(args, workspace), verify=False))
        if not prepared.selected:
            return prepared.status
        return run_and_lock(self, params, workspace, prepared.selected, prepared.selected) or prepared.status
