"""What XNNPACK's delegate took of the program, as ExecuTorch's delegation summary said at
build time (``executorch.json``): the ``xnnpack`` coverage certificate of the
:data:`EXECUTORCH_PROGRAM` this kind writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.core.kind import CoverageTarget, Format
from edgebuild.targets.coverage import Certificate, package_version

from .params import INFO_FILE, PROGRAM_FILE


# Calls outside a delegate that compute nothing (an output picked out of a tuple).
BOOKKEEPING_OPS = frozenset({"getitem"})


def delegation_certificate(info: dict[str, Any], executorch_version: str | None = None) -> Certificate:
    """ExecuTorch's delegation summary (``executorch.json`` of a build)."""
    fallbacks = info.get("fallback_nodes")
    if fallbacks is None:
        fallbacks = [{"node": None, "op_type": op, "module": None}
                     for op, counts in sorted(info.get("by_operator", {}).items())
                     for _ in range(int(counts.get("not_delegated", 0)))]
    delegated, other = int(info["delegated_nodes"]), int(info["not_delegated_nodes"])
    # get_delegation_info counts every call outside a delegate, the getitem that picks each
    # output out of the delegate's tuple among them: that runs nothing, on any processor,
    # and a fully delegated program must read 1.0.
    picks = [fallback for fallback in fallbacks if fallback.get("op_type") in BOOKKEEPING_OPS]
    fallbacks = [fallback for fallback in fallbacks if fallback.get("op_type") not in BOOKKEEPING_OPS]
    other -= len(picks)
    return Certificate(
        target="xnnpack", tool="executorch get_delegation_info",
        tool_version=executorch_version or package_version("executorch"),
        assumption=f"the {info.get('delegate', 'xnnpack')} partitioner at build time; nodes of the edge program",
        nodes_total=delegated + max(other, 0), nodes_taken=delegated, partitions=int(info["delegated_subgraphs"]),
        fallbacks=list(fallbacks),
    )


def xnnpack(directory: Path, memo: dict[str, Any]) -> Certificate:
    """The build's delegation summary, for a program lowered for XNNPACK."""
    info = read_json(directory / INFO_FILE, RECORD_BYTES)
    if info.get("delegate") != "xnnpack":
        raise LookupError(f"the program was lowered for {info.get('delegate')!r}, not xnnpack")
    return delegation_certificate(info)


XNNPACK = CoverageTarget("xnnpack", "ExecuTorch's XNNPACK delegate (the delegation summary at build time)",
                         f"{__name__}:xnnpack", vocabulary="edge dialect operators")
EXECUTORCH_PROGRAM = Format("executorch_program", "an ExecuTorch program", (PROGRAM_FILE, INFO_FILE),
                            certificates=(XNNPACK,))
