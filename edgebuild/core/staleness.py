"""Why an artifact is stale, in words: the difference between two build records."""

from __future__ import annotations

from typing import Any

from edgebuild.core.hashing import canonical_json


def explain(built: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Reasons, most specific first, why ``current`` differs from ``built``."""
    reasons: list[str] = []
    if built.get("kind") != current.get("kind"):
        reasons.append(f"kind {built.get('kind')} → {current.get('kind')}")
    reasons += parameter_changes(built.get("params", {}), current.get("params", {}))
    reasons += _input_changes(built.get("inputs", {}), current.get("inputs", {}),
                              built.get("inputs_named", {}), current.get("inputs_named", {}),
                              built.get("config_values", {}), current.get("config_values", {}))
    reasons += mapping_changes(built.get("code", {}), current.get("code", {}), "{} changed", "{} added", "{} removed")
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


def parameter_changes(before: dict[str, Any], after: dict[str, Any], prefix: str = "") -> list[str]:
    reasons = []
    for key in sorted(set(before) | set(after)):
        label = f"{prefix}{key}"
        if key not in before:
            reasons.append(f"{label} added ({_show(after[key])})")
        elif key not in after:
            reasons.append(f"{label} removed (was {_show(before[key])})")
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            reasons += parameter_changes(before[key], after[key], f"{label}.")
        elif before[key] != after[key]:
            reasons.append(f"{label} {_show(before[key])} → {_show(after[key])}")
    return reasons


def _input_changes(before: dict[str, Any], after: dict[str, Any],
                   named_before: dict[str, Any], named: dict[str, Any],
                   values_before: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """Changes of inputs, keyed by role (``checkpoint``, ``source``, ``files:<role>``);
    ``named_before`` and ``named`` say what the manifest called each then and now,
    ``values_before`` and ``values`` each checkpoint's config leaves (when recorded)."""
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
        if key.startswith("checkpoint") and isinstance(old, dict) and isinstance(new, dict):
            label = named.get(key, key)
            if old.get("config") != new.get("config"):
                keys = _config_changes(values_before.get(key), values.get(key))
                section = new.get("config_key")
                if keys:
                    reasons += [f"{label}: config.json {section + '.' if section else ''}{change}" for change in keys]
                else:
                    reasons.append(f"{label}: config.json ({section or 'all of it'}) changed")
            for file_name in sorted(set(old.get("files", {})) | set(new.get("files", {}))):
                if old.get("files", {}).get(file_name) != new.get("files", {}).get(file_name):
                    reasons.append(f"{label}: {file_name} changed")
            reasons += _tensor_changes(old.get("tensors", {}), new.get("tensors", {}))
        elif key.startswith("source") and isinstance(old, dict) and isinstance(new, dict):
            label = named.get(key, key)
            changed = mapping_changes(old.get("outputs", {}), new.get("outputs", {}), "{} changed", "{} added", "{} removed")
            reasons += [f"source artifact {label}: {change}" for change in changed] or [f"source artifact {label} changed"]
        elif key.startswith("source"):
            reasons.append(f"source artifact {named.get(key, key)} changed")
        elif key.startswith("files:") and isinstance(old, list) and isinstance(new, list):
            reasons += _file_list_changes(key.split(":", 1)[1], old, new, named_before.get(key, []), named.get(key, []))
        else:
            reasons.append(f"input {key} changed")
    return reasons


def _config_changes(before: Any, after: Any) -> list[str]:
    """The config keys that differ, by dotted name with old -> new; empty when either side
    did not record its config's leaves (then only "config.json changed" can be said)."""
    if not isinstance(before, dict) or not isinstance(after, dict) or before == after:
        return []
    return parameter_changes(before, after)


def _tensor_changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Tensors added, removed or changed, a whole module at a time: redrawing one block's
    weights is one line (``tensors model.visual.blocks.1.* changed (6 tensors)``), not one
    per tensor; a lone tensor is named as itself."""
    names = set(before) | set(after)
    added = {name for name in after if name not in before}
    removed = {name for name in before if name not in after}
    resized, changed = set(), set()
    for name in set(before) & set(after):
        first, second = before[name], after[name]
        if first == second:
            continue
        shapes = (first.get("dtype"), first.get("shape")), (second.get("dtype"), second.get("shape"))
        (resized if shapes[0] != shapes[1] else changed).add(name)
    reasons = [f"tensor {name} changed ({before[name]['dtype']}{before[name]['shape']} → "
               f"{after[name]['dtype']}{after[name]['shape']})" for name in sorted(resized)]
    for verb, group in (("added", added), ("removed", removed), ("changed", changed)):
        for prefix, count in tensor_groups(group, names):
            reasons.append(f"tensor {prefix} {verb}" if count == 1 else f"tensors {prefix}.* {verb} ({count} tensors)")
    return sorted(reasons, key=lambda reason: reason.split(" ", 2)[1])


def tensor_groups(chosen: set[str], names: set[str]) -> list[tuple[str, int]]:
    """``chosen`` (a subset of the tensor names ``names``) as the fewest dotted prefixes
    under which every tensor is chosen, each with how many tensors it covers; a tensor
    no such prefix covers with another is its own group (count 1)."""
    under: dict[str, int] = {}
    chosen_under: dict[str, int] = {}
    for name in names:
        for prefix in _prefixes(name):
            under[prefix] = under.get(prefix, 0) + 1
            if name in chosen:
                chosen_under[prefix] = chosen_under.get(prefix, 0) + 1
    groups: dict[str, int] = {}
    for name in chosen:
        # The shortest prefix that holds only chosen tensors, and more than this one.
        group = next((prefix for prefix in _prefixes(name)
                      if under[prefix] > 1 and chosen_under.get(prefix) == under[prefix]), name)
        groups[group] = chosen_under[group] if group != name else 1
    return sorted(groups.items())


def _prefixes(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the modules a tensor sits in, outermost first."""
    parts = name.split(".")
    return [".".join(parts[:index]) for index in range(1, len(parts))]


def _file_list_changes(role: str, before: list[str], after: list[str],
                       paths_before: list[str], paths: list[str]) -> list[str]:
    """Input files of one role, compared by name and content: adding one image names that
    image, not every image after it. (The order is content too -- calibration batches are
    summed in order -- so the same files in another order is a change of its own.)"""
    if len(paths_before) != len(before) or len(paths) != len(after):
        return _file_list_changes_by_position(role, before, after, paths)
    old, new = dict(zip(paths_before, before)), dict(zip(paths, after))
    reasons = []
    removed = {path: digest for path, digest in old.items() if path not in new}
    for path, digest in new.items():
        if path not in old:
            renamed = next((was for was, content in removed.items() if content == digest), None)
            if renamed is not None:
                del removed[renamed]
                reasons.append(f"{role}: {renamed} renamed {path}")
            else:
                reasons.append(f"{role}: {path} added")
        elif old[path] != digest:
            reasons.append(f"{role}: {path} changed")
    reasons += [f"{role}: {path} removed" for path in removed]
    return reasons or [f"{role}: the same files in another order"]


def _file_list_changes_by_position(role: str, before: list[str], after: list[str], paths: list[str]) -> list[str]:
    """For a record that does not name its files: compared by content and position."""
    if sorted(before) == sorted(after):
        return [f"{role}: the same files in another order"]
    reasons = []
    for index, digest in enumerate(after):
        if index >= len(before) or before[index] != digest:
            where = paths[index] if index < len(paths) else f"file {index + 1}"
            reasons.append(f"{role}: {where} changed" if index < len(before) else f"{role}: {where} added")
    if len(before) > len(after):
        reasons.append(f"{role}: {len(before) - len(after)} file(s) fewer")
    return reasons


def mapping_changes(before: dict[str, Any], after: dict[str, Any], changed: str, added: str, removed: str) -> list[str]:
    reasons = []
    for key in sorted(set(before) | set(after)):
        if key not in before:
            reasons.append(added.format(key))
        elif key not in after:
            reasons.append(removed.format(key))
        elif before[key] != after[key]:
            reasons.append(changed.format(key))
    return reasons


# Each part of a verification fingerprint (``BuildGraph.verify_identity``) beside the thresholds, in words.
VERIFY_PART_CHANGES = {
    "code": "the judging code changed",
    "files": "the files only verification reads changed (held-out inputs, or its sources' input files)",
    "ancestors_code": "the judging code of an artifact it is made from changed (the float model or the inputs it gives)",
    "ancestors_files": "the input files of an artifact further up its chain changed",
    "float": "the float model of its chain changed (the root's checkpoint, parameters, or torch/transformers)",
    "dataset": "the dataset of its gate changed (its files, labels or the samples drawn)",
    "coverage_tools": "a tool that computes its coverage certificates changed version (they are computed again; "
                      "the build is not)",
}


# Parts a verification fingerprint gained in a later edgebuild (CHANGELOG.md).
PARTS_SINCE = ("coverage_tools",)


def coverage_tool_changes(certificates: Any, tools: dict[str, str]) -> list[str]:
    """Each certificate a report holds whose tool is at another version now, in words
    (``coverage TARGET: onnxruntime 1.31.0 -> 1.32.0 ...``); ``tools``: target -> "package
    version" now (``BuildGraph.coverage_tools``)."""
    reasons = []
    for target, now in tools.items():
        package, _, version = now.partition(" ")
        found = certificates.get(target) if isinstance(certificates, dict) else None
        before = found.get("tool_version") if isinstance(found, dict) else None
        if isinstance(before, str) and before != version:
            reasons.append(f"coverage {target}: {package} {before} -> {version} (its certificate is computed again; "
                           "the build is not)")
    return reasons


def verification_changes(thresholds_before: dict[str, Any] | None, parts_before: dict[str, Any] | None,
                         thresholds: dict[str, Any], parts: dict[str, Any], skip: tuple[str, ...] = ()) -> list[str]:
    """Why an artifact's verification is out of date, in words: its thresholds, key by key
    (``verify.cosine_min 0.99 -> 0.995``, a default become a value included), then each
    other part of its verification fingerprint that moved (by digest). ``skip``: parts
    the caller says in more detail."""
    reasons = parameter_changes(thresholds_before, thresholds, "verify.") if isinstance(thresholds_before, dict) else []
    if isinstance(parts_before, dict):
        for part in sorted(set(parts_before) | set(parts)):
            if part in PARTS_SINCE and part not in parts_before:
                continue  # judged by an edgebuild that did not keep this part: not a change of it
            if part not in skip and part in VERIFY_PART_CHANGES and parts_before.get(part) != parts.get(part):
                reasons.append(VERIFY_PART_CHANGES[part])
    return reasons
