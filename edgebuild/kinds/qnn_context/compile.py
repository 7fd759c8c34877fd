"""Compiling a QDQ graph into a QNN context, in a process of its own.

    python -m edgebuild.kinds.qnn_context.compile SOURCE_MODEL OUT_MODEL SOC_MODEL HTP_ARCH

Run by ``build.py`` as a child process, never in the build's own: the QNN backend
numbers the tensors of every graph it compiles from a counter that lives as long as
the process, and those numbers are in the context binary. Compiled in a second
session of one process, the same graph gives different bytes (measured: 2100 bytes
of a 1.3 MiB binary differ); in a fresh process, the same bytes every time and in
any directory. Prints one JSON line: the session's placement of the graph.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from edgebuild.plugin import EdgebuildError, ExportError
from .qnn import htp_session, partitions, refused_nodes

PROTOBUF_LIMIT = 2**31


def compile_context(source_model: Path, out_model: Path, soc_model: int, htp_arch: int) -> dict[str, Any]:
    import onnx

    # From bytes with the weights inline, not from the file: onnxruntime names the
    # compiled partition after a hash of the model's path (or, for external data, of
    # where the data lives), which would make the context's bytes depend on the
    # directory it was built in. Quantized weights are a quarter of the float ones
    # (438 MiB for the full-size tower), far below protobuf's 2 GiB.
    model = onnx.load(str(source_model))
    if model.ByteSize() >= PROTOBUF_LIMIT:
        raise ExportError(f"{source_model}: {model.ByteSize() / 2**30:.1f} GiB with its weights inline; "
                          f"over protobuf's 2 GiB, which compiling from memory needs")
    model_bytes = model.SerializeToString()
    source_nodes = len(model.graph.node)
    del model
    session = htp_session(
        source_model,
        {"soc_model": str(soc_model), "htp_arch": str(htp_arch)},
        {
            "ep.context_enable": "1",
            "ep.context_file_path": str(out_model),
            # The binary beside the graph, not inside it: the runtime can map a
            # separate file, and a graph with a multi-hundred-MB attribute is unwieldy.
            "ep.context_embed_mode": "0",
        },
        model_bytes,
    )
    return {"source_nodes": source_nodes, "partitions": partitions(session)}


def refused(source_model: Path, soc_model: int, htp_arch: int) -> list[dict[str, str]]:
    """The nodes the HTP backend does not take, asked of a session that lets the CPU take
    them (no context is written): what a compile with fallback disabled refused."""
    session = htp_session(source_model, {"soc_model": str(soc_model), "htp_arch": str(htp_arch)}, {}, cpu_fallback=True)
    return refused_nodes(session)


def main() -> int:
    source_model, out_model, soc_model, htp_arch = sys.argv[1:5]
    try:
        result = compile_context(Path(source_model), Path(out_model), int(soc_model), int(htp_arch))
    except EdgebuildError as error:
        failure: dict[str, Any] = {"error": str(error)}
        try:
            failure["refused"] = refused(Path(source_model), int(soc_model), int(htp_arch))
        except EdgebuildError:
            pass  # the backend refuses the graph as a whole (a SoC it does not know): no nodes to name
        print(json.dumps(failure))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
