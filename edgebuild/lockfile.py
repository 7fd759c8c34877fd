"""The lock file, ``artifacts.lock``: what each built artifact is, meant to be committed.

For every artifact built at its current fingerprint it records that
fingerprint, the fingerprints of the inputs it read, its parameters, the code
and tool versions, the size and digest of each output file, and whether it
verified. A reviewer reads an artifact's change in the diff of this file (an
input changed, a tool was upgraded, an output's bytes moved), and anyone can
check a file in ``build/`` against it.

``doit build`` and ``doit verify`` rewrite it after running, for the artifacts
they ran (and what those depend on); other artifacts' entries are kept as they
were, entries of artifacts no longer in the manifest are dropped. It holds no
timestamps, so an unchanged build leaves it byte for byte unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .builder import is_built, read_record
from .errors import EdgebuildError, LockfileError
from .fingerprint import locked
from .project import Project
from .report import read_report

LOCK_FORMAT = 1


def lock_entry(project: Project, name: str) -> dict[str, Any] | None:
    """The entry of ``name``; ``None`` when it is not built at its current fingerprint."""
    try:
        if not is_built(project, name):
            return None
        verify_fingerprint = project.verify_fingerprint(name)
    except EdgebuildError:
        return None
    record = read_record(project.layout.artifact_dir(name))
    assert record is not None  # is_built read it
    report = read_report(project.layout.artifact_dir(name))
    verified = None
    if report and report.get("verify_fingerprint") == verify_fingerprint:
        verified = bool(report.get("passed"))
    return {
        "kind": record["kind"],
        "fingerprint": record["fingerprint"],
        "inputs": record["inputs"],
        "params": record["params"],
        "code": record["code"],
        "versions": record["versions"],
        "outputs": record.get("outputs", {}),
        # true / false: verified against the current thresholds, passed or failed; null: not verified.
        "verified": verified,
        "verify_fingerprint": verify_fingerprint if verified is not None else None,
    }


def read_lock(path: Path) -> dict[str, Any]:
    """The artifacts of the lock file at ``path`` (empty when there is none)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError) as error:
        raise LockfileError(f"{path}: not valid JSON ({error}); delete it and run `doit build` to write it afresh") from None
    if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT or not isinstance(data.get("artifacts"), dict):
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise LockfileError(
            f"{path}: expected a lock file of format {LOCK_FORMAT}, found format {found!r}; "
            "delete it and run `doit build` to write it afresh"
        )
    return data["artifacts"]


def render_lock(artifacts: dict[str, Any]) -> str:
    return json.dumps({"format": LOCK_FORMAT, "artifacts": artifacts}, indent=2, sort_keys=True) + "\n"


def update_lock(project: Project, names: list[str]) -> bool:
    """Refresh the entries of ``names`` in the project's lock file; ``True`` when it changed."""
    path = project.lock_path
    with locked(project.layout.cache_dir / "locks" / f"{path.name}.lock"):
        artifacts = {name: entry for name, entry in read_lock(path).items() if name in project.manifest.artifacts}
        for name in names:
            entry = lock_entry(project, name)
            if entry is None:
                artifacts.pop(name, None)
            else:
                artifacts[name] = entry
        text = render_lock(artifacts)
        try:
            if path.read_text(encoding="utf-8") == text:
                return False
        except FileNotFoundError:
            pass
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
        return True
