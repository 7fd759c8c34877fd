"""The state of each artifact: up to date, stale (with reasons), missing; and the
size/age parsing of ``doit gc``."""

from __future__ import annotations

import re
from typing import Any

from .builder import is_built, is_verified, read_record
from .errors import EdgebuildError
from .project import Project
from .report import read_report
from .staleness import explain

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_AGES = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def artifact_status(project: Project, name: str) -> dict[str, Any]:
    directory = project.layout.artifact_dir(name)
    try:
        current = project.record(name)
    except EdgebuildError as error:
        return {"artifact": name, "state": "error", "reasons": [str(error)]}
    built = read_record(directory)
    restorable = project.store.has(current["fingerprint"])
    state: dict[str, Any] = {"artifact": name, "fingerprint": current["fingerprint"]}
    if built is None:
        state["state"] = "missing"
        if restorable:
            state["note"] = "restorable from the store"
        return state
    if built.get("fingerprint") != current["fingerprint"]:
        state["state"] = "stale"
        state["reasons"] = explain(built, current)
        if restorable:
            state["note"] = "restorable from the store"
        return state
    if not is_built(project, name):
        state["state"] = "stale"
        state["reasons"] = ["an output file is missing or changed size"]
        return state
    state["state"] = "up to date"
    report = read_report(directory)
    if is_verified(project, name):
        state["note"] = "verified"
    elif report and report.get("verify_fingerprint") == project.verify_fingerprint(name) and not report.get("passed"):
        state["note"] = "verification FAILED"
    else:
        state["note"] = "not verified"
    return state


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"--max-size: expected a size like 500M or 20G, found {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def parse_age(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise ValueError(f"--max-age: expected an age like 12h or 30d, found {text!r}")
    return float(match.group(1)) * _AGES[match.group(2)]
