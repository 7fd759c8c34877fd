"""``doit status [ARTIFACT ...]``: which artifacts are up to date (verified or not),
stale (and why), missing, or in error (``edgebuild/run/state.py``); builds nothing."""

from __future__ import annotations

import json
import sys

from edgebuild.cli.common import JSON_OPTION, NamesAnywhere, WorkspaceCommand, handles, selected


class Status(NamesAnywhere, WorkspaceCommand):
    name = "status"
    doc_purpose = "say which artifacts are up to date, stale (and why), missing, or in error"
    doc_usage = "[ARTIFACT ...] [--check] [--json]"
    doc_description = (
        "Reads fingerprints only (through the stat cache); builds nothing. Exits 1 when an artifact is "
        "in error (its parameters or inputs cannot be read); with --check, also when one is stale, missing, "
        "or up to date but not verified at its current verification fingerprint (a CI gate)."
    )
    cmd_options = (
        JSON_OPTION,
        {"name": "check", "short": "", "long": "check", "type": bool, "default": False,
         "help": "exit 1 unless every artifact is up to date and verified (for CI)"},
    )

    def run(self, workspace, params, args):  # noqa: D102
        from edgebuild.cli.tasks import collection_paused
        from edgebuild.run.state import statuses

        names = selected(args, workspace)
        with collection_paused():
            states = statuses(workspace, handles(workspace, names))
        workspace.save_caches()
        if params["as_json"]:
            print(json.dumps([state.to_json() for state in states], indent=2))
        else:
            width = max(len(name) for name in names)
            for state in states:
                line = f"{state.artifact:<{width}}  {state.state}"
                if state.note:
                    line += f" ({state.note})"
                print(line)
                for reason in state.reasons:
                    print(f"{'':<{width}}    - {reason}")
        sys.stdout.flush()
        counts: dict[str, int] = {}
        for state in states:
            # A gate passes only what is verified now: "up to date (not verified)" after a
            # threshold change is not done.
            key = state.state if state.state != "up to date" or state.verified else f"up to date ({state.note})"
            counts[key] = counts.get(key, 0) + 1
        not_current = {key: count for key, count in counts.items() if key != "up to date"}
        if counts.get("error") or (params["check"] and not_current):
            summary = ", ".join(f"{count} {key}" for key, count in sorted(not_current.items()))
            print(f"edgebuild: status: {summary} (of {len(states)})", file=sys.stderr, flush=True)
            return 1
        return 0
