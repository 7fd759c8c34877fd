"""Why an artifact is stale, in words: the difference between two build records."""

from __future__ import annotations

from typing import Any

from .hashing import canonical_json


def explain(built: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Reasons, most specific first, why ``current`` differs from ``built``."""
    reasons: list[str] = []
    if built.get("kind") != current.get("kind"):
        reasons.append(f"kind {built.get('kind')} → {current.get('kind')}")
    reasons += _parameter_changes(built.get("params", {}), current.get("params", {}))
    reasons += _input_changes(built.get("inputs", {}), current.get("inputs", {}))
    reasons += _mapping_changes(built.get("code", {}), current.get("code", {}), "{} changed", "{} added", "{} removed")
    for package in sorted(set(built.get("versions", {})) | set(current.get("versions", {}))):
        before, after = built.get("versions", {}).get(package), current.get("versions", {}).get(package)
        if before != after:
            reasons.append(f"{package} {before} → {after}")
    if not reasons and built.get("fingerprint") != current.get("fingerprint"):
        reasons.append("record format changed")
    return reasons


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return canonical_json(value)
    return str(value)


def _parameter_changes(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> list[str]:
    reasons = []
    for key in sorted(set(before) | set(after)):
        label = f"{prefix}{key}"
        if key not in before:
            reasons.append(f"{label} added ({_show(after[key])})")
        elif key not in after:
            reasons.append(f"{label} removed (was {_show(before[key])})")
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            reasons += _parameter_changes(before[key], after[key], f"{label}.")
        elif before[key] != after[key]:
            reasons.append(f"{label} {_show(before[key])} → {_show(after[key])}")
    return reasons


def _input_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    reasons = []
    for key in sorted(set(before) | set(after)):
        if key not in before:
            reasons.append(f"input {key} added")
            continue
        if key not in after:
            reasons.append(f"input {key} removed")
            continue
        old, new = before[key], after[key]
        if old == new:
            continue
        if key.startswith("checkpoint:") and isinstance(old, dict) and isinstance(new, dict):
            label = key.split(":", 1)[1]
            if old.get("config") != new.get("config"):
                section = new.get("config_key") or "config.json"
                reasons.append(f"checkpoint {label}: config.json {section} changed")
            old_files, new_files = old.get("files", {}), new.get("files", {})
            for file_name in sorted(set(old_files) | set(new_files)):
                if old_files.get(file_name) != new_files.get(file_name):
                    reasons.append(f"checkpoint {label}: {file_name} changed")
            old_tensors, new_tensors = old.get("tensors", {}), new.get("tensors", {})
            for name in sorted(set(old_tensors) | set(new_tensors)):
                if name not in old_tensors:
                    reasons.append(f"tensor {name} added")
                elif name not in new_tensors:
                    reasons.append(f"tensor {name} removed")
                elif old_tensors[name] != new_tensors[name]:
                    first, second = old_tensors[name], new_tensors[name]
                    if (first["dtype"], first["shape"]) != (second["dtype"], second["shape"]):
                        reasons.append(
                            f"tensor {name} changed ({first['dtype']}{first['shape']} → {second['dtype']}{second['shape']})"
                        )
                    else:
                        reasons.append(f"tensor {name} changed")
        elif key.startswith("artifact:"):
            reasons.append(f"source artifact {key.split(':', 1)[1]} changed ({str(old)[:12]} → {str(new)[:12]})")
        elif key.startswith("file:"):
            reasons.append(f"input file {key.split(':', 1)[1]} changed")
        else:
            reasons.append(f"input {key} changed")
    return reasons


def _mapping_changes(before: dict[str, Any], after: dict[str, Any], changed: str, added: str, removed: str) -> list[str]:
    reasons = []
    for key in sorted(set(before) | set(after)):
        if key not in before:
            reasons.append(added.format(key))
        elif key not in after:
            reasons.append(removed.format(key))
        elif before[key] != after[key]:
            reasons.append(changed.format(key))
    return reasons
