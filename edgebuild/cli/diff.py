"""``doit diff [ARTIFACT ...] [--against REF]``: what changed in each artifact since the
build a git revision's committed lock file names, or the latest one published at a
destination (``edgebuild/run/diff.py``); builds nothing."""

from __future__ import annotations

import json
import sys

from edgebuild.cli.common import JSON_OPTION, NamesAnywhere, WorkspaceCommand, fail, handles, selected
from edgebuild.errors import EdgebuildError


class Diff(NamesAnywhere, WorkspaceCommand):
    name = "diff"
    doc_purpose = "say what changed in each artifact since a commit's lock file, or since it was published"
    doc_usage = "[ARTIFACT ...] [--against REF|DEST] [--json] [--all]"
    doc_description = (
        "REF is a git revision (default HEAD): its committed lock file names the fingerprints to compare "
        "with. DEST (a directory path or an fsspec URL such as s3://bucket/artifacts) compares with the "
        "latest build published there. For each artifact: what changed in its fingerprint (parameters "
        "old -> new, checkpoint tensors, config keys and input files by name, code modules, tool "
        "versions), its output files' sizes, and every verification check old -> new with the delta and "
        "any verdict that flipped. Old builds are read from the local store, the remote cache or the "
        "destination; nothing is built. Exits 0 (a diff is information), 2 when REF cannot be read."
    )
    cmd_options = (
        {"name": "against", "short": "", "long": "against", "type": str, "default": "HEAD",
         "help": "a git revision whose committed lock file to compare with (default HEAD), "
                 "or a published destination"},
        {"name": "all", "short": "", "long": "all", "type": bool, "default": False,
         "help": "show the checks and outputs of unchanged artifacts too"},
        JSON_OPTION,
    )

    def run(self, workspace, params, args):  # noqa: D102
        from edgebuild.run.diff import diff, render

        artifacts = handles(workspace, selected(args, workspace)) if args else None
        try:
            result = diff(workspace, artifacts, params["against"])
        except EdgebuildError as error:
            fail(str(error))
            return 2
        workspace.save_caches()
        if params["as_json"]:
            print(json.dumps(result.to_json(), indent=2))
        else:
            print("\n".join(render(result, verbose=params["all"])))
        sys.stdout.flush()
        return 0
