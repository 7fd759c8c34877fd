"""``doit publish [ARTIFACT ...] --to DEST``: verify, then publish every artifact named
(all by default) with its report, provenance and checksums (``edgebuild/run/publish.py``)."""

from __future__ import annotations

from doit.cmd_run import Run
from doit.exceptions import InvalidCommand

from edgebuild.cli.common import (FAIL_FAST_OPTION, NamesAnywhere, fail, handles, open_workspace, run_and_lock,
                                  selected)
from edgebuild.cli.options import PUBLISH_OPTIONS, prepare
from edgebuild.errors import EdgebuildError, PublishError


class Publish(NamesAnywhere, Run):
    name = "publish"
    doc_purpose = "verify artifacts (all, or the ones named), then publish them to DEST"
    doc_usage = "[ARTIFACT ...] --to DEST [--allow-dirty] [--pull-only | --frozen]"
    doc_description = (
        "DEST is a directory or an fsspec URL (file://, s3://bucket/prefix, ...). Each artifact goes to "
        "DEST/<artifact>/<fingerprint>/ with its report, provenance.json and SHA256SUMS; DEST/index.json "
        "lists them. Publishes nothing, and exits non-zero, unless every artifact named verified. Refuses "
        "a work tree with uncommitted changes, or outside git, unless --allow-dirty (then recorded in "
        "provenance.json)."
    )
    cmd_options = Run.cmd_options + (
        {"name": "to", "short": "", "long": "to", "type": str, "default": "",
         "help": "where to publish: a directory or an fsspec URL"},
        {"name": "allow_dirty", "short": "", "long": "allow-dirty", "type": bool, "default": False,
         "help": "publish from uncommitted changes or outside git (recorded in provenance.json)"},
        FAIL_FAST_OPTION,
    ) + PUBLISH_OPTIONS

    def execute(self, params, args):  # noqa: D102 - doit's signature
        from edgebuild.run.publish import check_destination, check_publishable, check_work_tree, publish

        if not params["to"]:
            raise InvalidCommand("give --to DEST: a directory or an fsspec URL such as s3://bucket/artifacts")
        workspace = open_workspace(self, params)
        names = selected(args, workspace)
        artifacts = handles(workspace, names)
        try:
            # Before anything is built: what would be published must be what is committed,
            # and the destination one that takes it (a bucket, outside the work tree, an
            # index this version merges into).
            check_work_tree(workspace, allow_dirty=params["allow_dirty"], artifacts=artifacts)
            check_destination(workspace, params["to"])
        except EdgebuildError as error:
            fail(str(error))
            return 3
        prepared = prepare(workspace, params, names, verify=True)  # --remote-readonly, --pull-only
        if prepared.status:
            return prepared.status
        result = run_and_lock(self, params, workspace, names, [f"verify:{name}" for name in names], verifying=True)
        try:
            check_publishable(workspace, artifacts)
            if result != 0:
                raise PublishError("nothing published: a task failed (see above)")
            publish(workspace, artifacts, params["to"], log=lambda message: print(message, flush=True),
                    allow_dirty=params["allow_dirty"])
        except EdgebuildError as error:
            fail(str(error))
            return result or 1
        return 0
