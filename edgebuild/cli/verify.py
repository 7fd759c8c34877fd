"""``doit verify [ARTIFACT ...]``: build what is stale, verify every selected artifact
even when one fails, then one summary line (passed, failed, not run)."""

from __future__ import annotations

from doit.cmd_run import Run

from edgebuild.cli.common import (
    FAIL_FAST_OPTION, NamesAnywhere, open_workspace, run_and_lock, selected, with_those_failed_elsewhere,
)
from edgebuild.cli.options import VERIFY_OPTIONS, on_cluster, prepare
from edgebuild.run.scheduler import verification_summary


class Verify(NamesAnywhere, Run):
    name = "verify"
    doc_purpose = "build what is stale, then verify artifacts (all, or the ones named)"
    doc_usage = "[--shard I/N] [--dask ADDRESS] [--pull-only | --frozen] [ARTIFACT ...] [--fail-fast]"
    doc_description = (
        "Verifies every selected artifact even when one fails, then prints one line: how many passed, "
        "failed and were not run (their build, or a source's, failed). Writes build/<name>/report.json "
        "and report.md, refreshes the lock file; exits non-zero if anything failed."
    )
    cmd_options = Run.cmd_options + (FAIL_FAST_OPTION,) + VERIFY_OPTIONS

    def execute(self, params, args):  # noqa: D102 - doit's signature
        workspace = open_workspace(self, params)
        asked = selected(args, workspace)
        prepared = on_cluster(workspace, params, prepare(workspace, params, asked, verify=True))
        if not prepared.selected:
            # An empty shard, or nothing the cluster made can be pulled (doit would run the default tasks).
            if prepared.elsewhere is not None:
                names = with_those_failed_elsewhere(workspace, asked, prepared.elsewhere)
                print(verification_summary(prepared.elsewhere.verification(names)), flush=True)
            return prepared.status
        tasks = [f"verify:{name}" for name in prepared.selected]
        result = run_and_lock(self, params, workspace, prepared.selected, tasks, verifying=True,
                              elsewhere=prepared.elsewhere)
        return result or prepared.status
