"""Frozen runs: every fingerprint taken from the lock file as committed, no checkpoint read.

A gather or publish runner pulls verified builds by fingerprint. Computing a fingerprint
means hashing the checkpoint (a 27B checkpoint is a 50 GB download to pull a 2 GB
artifact), so ``--frozen`` takes each artifact's build record from the committed lock
file instead, as DVC pulls by the hashes in ``dvc.lock``. What makes that honest is
that the lock entry must be this checkout's: the manifest's kind and parameters, this
code's digests and these tool versions, its sources' entries, and a record that hashes
to the fingerprint it states. Anything else is one line naming the artifact; it is
never pulled by a fingerprint this commit would not build.

What a frozen run cannot do is judge (that needs the checkpoint): it takes only builds
whose entry a trusted key signed, with a report at the verification fingerprint this
checkout computes (thresholds, judging code and verification-only files are all here).
"""

from __future__ import annotations

from typing import Any

from edgebuild.core.record import BuildRecord
from edgebuild.errors import LockfileError

# An artifact handle (``edgebuild.core.project.Artifact``, which calls this module: not
# imported here, even for annotations).
Artifact = Any


def _differences(locked: Any, here: Any) -> list[str]:
    if not isinstance(locked, dict) or not isinstance(here, dict):
        return ["(all)"]
    return sorted(key for key in locked.keys() | here.keys() if locked.get(key) != here.get(key))


def _listed(keys: list[str], limit: int = 3) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def frozen_record(artifact: Artifact, sources: list[tuple[str, Artifact]], entries: dict[str, Any], shown: str,
                  code: dict[str, str], versions: dict[str, str]) -> BuildRecord:
    """The build record of ``artifact`` from its lock entry in ``entries`` (``shown``: how
    the lock is named in messages), checked against the manifest, its ``sources`` (role,
    artifact) and their entries, ``code`` (this checkout's digests of its build code) and
    ``versions`` (these tools'). :class:`LockfileError`, naming the artifact, when the
    entry is missing or is not this checkout's."""
    name = artifact.name
    again = f"run doit verify without --frozen (with the checkpoints) and commit {shown.split(' ')[0]}"
    entry = entries.get(name)
    if not isinstance(entry, dict):
        raise LockfileError(f"{name}: {shown} has no entry for it; --frozen takes every fingerprint from it ({again})")
    params = artifact.params
    if entry.get("kind") != params.kind:
        raise LockfileError(f"{name}: kind {entry.get('kind')!r} in {shown}, {params.kind!r} in the manifest ({again})")
    changed = _differences(entry.get("params"), params.build_parameters())
    if changed:
        raise LockfileError(f"{name}: {shown} was written for other parameters ({_listed(changed)} differ; {again})")
    changed = _differences(entry.get("code"), code)
    if changed:
        raise LockfileError(f"{name}: {shown} was written by other code ({_listed(changed)} differ; {again})")
    changed = _differences(entry.get("versions"), versions)
    if changed:
        locked = entry.get("versions") if isinstance(entry.get("versions"), dict) else {}
        tools = [f"{tool} {locked.get(tool)} in the lock, {versions.get(tool)} here" for tool in changed]
        raise LockfileError(f"{name}: {shown} was written with other tools ({_listed(tools)}; {again})")
    inputs = entry.get("inputs")
    for role, source in sources:
        source_entry = entries.get(source.name)
        outputs = source_entry.get("outputs") if isinstance(source_entry, dict) else None
        expected = {"outputs": dict(sorted((relative, meta.get("digest")) for relative, meta in outputs.items()
                                           if isinstance(meta, dict)))} if isinstance(outputs, dict) else None
        if not isinstance(inputs, dict) or inputs.get(role) != expected:
            raise LockfileError(f"{name}: {shown} records another build of its source {source.name} than "
                                f"{source.name}'s own entry ({again})")
    try:
        record = BuildRecord.create(kind=params.kind, params=entry["params"], inputs=inputs, code=code,
                                    versions=versions)
        record = BuildRecord.model_validate(record.to_json() | {
            "inputs_named": entry.get("inputs_named") or {},
            "checkpoint_origins": entry.get("checkpoint_origins") or {},
            "config_values": entry.get("config_values") or {},
        })
    except (ValueError, TypeError):
        raise LockfileError(f"{name}: {shown} holds an entry this version cannot read ({again})") from None
    if record.fingerprint != entry.get("fingerprint"):
        raise LockfileError(f"{name}: {shown}'s entry does not hash to the fingerprint it states (edited by hand?; {again})")
    return record
