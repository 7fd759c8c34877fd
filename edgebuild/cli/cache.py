"""``doit cache [ARTIFACT ...]``: what the local store and the remote cache hold, one line
per build kept."""

from __future__ import annotations

import json
import time

from edgebuild.cli.common import JSON_OPTION, NamesAnywhere, WorkspaceCommand, current_fingerprints, fail
from edgebuild.core.console import format_age, format_size, shown_path
from edgebuild.errors import EdgebuildError


class Cache(NamesAnywhere, WorkspaceCommand):
    name = "cache"
    doc_purpose = "list what the local store and the remote cache hold"
    doc_usage = "[ARTIFACT ...] [--json]"
    doc_description = (
        "One line per build kept: the artifact, its fingerprint, its size and its age (local store: "
        "since last used; remote cache: since pushed). 'current' marks the build the manifest asks for now."
    )
    cmd_options = (
        JSON_OPTION,
    )

    def run(self, workspace, params, args):  # noqa: D102
        current = current_fingerprints(workspace)
        now = time.time()
        sections = [
            ("local store", shown_path(workspace.store.root),
             [(entry.artifact, entry.fingerprint, entry.size, entry.last_used) for entry in workspace.store.entries()])
        ]
        try:
            # Opening the remote cache is reaching it: the same failure as a listing's.
            opened = workspace.remote
            if opened is not None:
                remote = [(entry.artifact, entry.fingerprint, entry.size, entry.pushed) for entry in opened.entries()]
                sections.append(("remote cache", opened.label, remote))
        except EdgebuildError as error:
            fail(str(error))
            return 1
        if args:
            sections = [(title, where, [row for row in rows if row[0] in args]) for title, where, rows in sections]
        if params["as_json"]:
            print(json.dumps([
                {"where": title, "location": where, "entries": [
                    {"artifact": artifact, "fingerprint": fingerprint, "size": size, "time": stamp,
                     "current": current.get(artifact) == fingerprint}
                    for artifact, fingerprint, size, stamp in rows]}
                for title, where, rows in sections], indent=2))
            return 0
        for title, where, rows in sections:
            total = sum(row[2] for row in rows)
            count = f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}"
            print(f"{title} ({where}): {count}, {format_size(total)}")
            if not rows:
                continue
            table = [("ARTIFACT", "FINGERPRINT", "SIZE", "LAST USED" if title == "local store" else "PUSHED", "")]
            for artifact, fingerprint, size, stamp in sorted(rows, key=lambda row: (str(row[0]), -(row[3] or 0))):
                table.append((
                    artifact or "?", fingerprint[:12], format_size(size),
                    f"{format_age(now - stamp)} ago" if stamp else "?",
                    "current" if current.get(artifact) == fingerprint else "",
                ))
            widths = [max(len(row[column]) for row in table) for column in range(4)]
            for row in table:
                print(("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4]).rstrip())
        if opened is None:
            print("remote cache: none (set remote_cache in the manifest, or EDGEBUILD_REMOTE_CACHE)")
        return 0
