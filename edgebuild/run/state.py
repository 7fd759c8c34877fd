"""The state of each artifact: up to date (verified or not), stale (with reasons), missing."""

from __future__ import annotations

from typing import Any

from edgebuild.errors import EdgebuildError
from edgebuild.core.project import Project
from edgebuild.core.record import VerificationState, read_record_or_none, verification_state
from edgebuild.core.staleness import explain


def artifact_status(project: Project, name: str) -> dict[str, Any]:
    directory = project.layout.artifact_dir(name)
    try:
        current = project.record(name)
    except EdgebuildError as error:
        return {"artifact": name, "state": "error", "reasons": [str(error)]}
    built = read_record_or_none(directory)
    restorable = project.store.has(current.fingerprint)
    state: dict[str, Any] = {"artifact": name, "fingerprint": current.fingerprint}
    if built is None:
        state["state"] = "missing"
        if restorable:
            state["note"] = "restorable from the store"
        return state
    if built.fingerprint != current.fingerprint:
        state["state"] = "stale"
        state["reasons"] = explain(built.to_json(), current.to_json())
        if restorable:
            state["note"] = "restorable from the store"
        return state
    verification = verification_state(project, name)
    if verification is VerificationState.NOT_BUILT:
        state["state"] = "stale"
        state["reasons"] = ["an output file is missing or changed size"]
        return state
    state["state"] = "up to date"
    state["note"] = "verification FAILED" if verification is VerificationState.FAILED else verification.value
    return state
