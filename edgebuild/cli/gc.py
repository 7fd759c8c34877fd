"""``doit gc``: prune the local store by size and/or age; the builds the manifest asks
for now are always kept."""

from __future__ import annotations

import re
import time

from doit.exceptions import InvalidCommand

from edgebuild.cli.common import WorkspaceCommand, current_fingerprints
from edgebuild.core.console import format_age, format_size

_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str) -> int:
    """``500M``, ``20G``, ``1.5g`` -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"--max-size: expected a size like 500M or 20G, found {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_age(text: str) -> float:
    """``12h``, ``30d`` -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise ValueError(f"--max-age: expected an age like 12h or 30d, found {text!r}")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


class Gc(WorkspaceCommand):
    name = "gc"
    doc_purpose = "prune the local store (cache/store) by size and/or age"
    doc_usage = "[--max-size 20G] [--max-age 30d] [--dry-run]"
    doc_description = (
        "The builds the manifest asks for now are always kept. With neither limit, removes only what "
        "interrupted writes left behind and says what the store holds."
    )
    cmd_options = (
        {"name": "max_size", "short": "", "long": "max-size", "type": str, "default": "",
         "help": "keep the store under this size (e.g. 500M, 20G)"},
        {"name": "max_age", "short": "", "long": "max-age", "type": str, "default": "",
         "help": "remove entries unused for longer than this (e.g. 12h, 30d)"},
        {"name": "dry_run", "short": "", "long": "dry-run", "type": bool, "default": False,
         "help": "only say what would be removed"},
    )

    def run(self, workspace, params, args):  # noqa: D102
        try:
            max_bytes = parse_size(params["max_size"]) if params["max_size"] else None
            max_age = parse_age(params["max_age"]) if params["max_age"] else None
        except ValueError as error:
            raise InvalidCommand(str(error)) from None
        store = workspace.store
        keep = set(current_fingerprints(workspace).values())
        if max_bytes is None and max_age is None:
            leftovers = 0 if params["dry_run"] else store.remove_leftovers()
            entries = list(store.entries())
            kept = [entry for entry in entries if entry.fingerprint in keep]
            print(
                f"the store holds {len(entries)} entries in {format_size(store.size())} of blobs "
                f"({len(kept)} current, {format_size(sum(entry.size for entry in kept))})"
                + (f"; removed {leftovers} leftovers of interrupted writes" if leftovers else "")
            )
            print("to prune it, give --max-size and/or --max-age (e.g. doit gc --max-age 30d; --dry-run to preview)")
            return 0
        result = store.gc(max_bytes, max_age, keep, dry_run=params["dry_run"])
        if not params["dry_run"]:
            store.remove_leftovers()
        verb = "would remove" if params["dry_run"] else "removed"
        now = time.time()
        for entry in result.removed:
            print(f"{verb} {entry.artifact or '?'} {entry.fingerprint[:12]} "
                  f"({format_size(entry.size)}, last used {format_age(now - entry.last_used)} ago)")
        count = len(result.removed)
        unreached = (f", and {result.unreached_blobs} blob{'' if result.unreached_blobs == 1 else 's'} no entry reached"
                     if result.unreached_blobs else "")
        # Blobs shared with an entry that stays free nothing: the bytes are what the disk gets back.
        print(f"{verb} {count} entr{'y' if count == 1 else 'ies'}{unreached}, "
              f"freeing {format_size(result.freed_bytes)}")
        return 0
