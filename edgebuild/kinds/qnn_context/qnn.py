"""onnxruntime's QNN execution provider: finding it, and sessions on the HTP backend.

``onnxruntime-qnn`` (2.x) is not a build of onnxruntime but a plugin: a provider
library and Qualcomm's QNN backends, registered with the installed onnxruntime at
run time. Registered providers are used through ``add_provider_for_devices``: a
plugin named in ``InferenceSession(providers=[...])`` is silently ignored and the
CPU runs everything (measured: 0 of 396 nodes on QNN that way). On x86_64 the HTP
backend is Qualcomm's simulator: it compiles exactly as for the device, and runs
the compiled graph bit-accurately but slowly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.plugin import ExportError
from .params import PROVIDER, QNN_PACKAGE


def qnn_unavailable_reason() -> str | None:
    """Why the QNN provider cannot be used here, or ``None`` when it can."""
    import onnxruntime

    if PROVIDER in onnxruntime.get_available_providers():
        return None
    try:
        import onnxruntime_qnn
    except ImportError:
        return (f"{PROVIDER} is not available: {QNN_PACKAGE} is not installed "
                f"(pip install -e '.[qnn]'; wheels exist for Linux x86_64 and Windows)")
    try:
        onnxruntime.register_execution_provider_library(PROVIDER, onnxruntime_qnn.get_library_path())
    except Exception as error:  # onnxruntime raises its own Fail/RuntimeError types
        return f"{PROVIDER}: {QNN_PACKAGE} is installed but onnxruntime cannot load its library ({error})"
    if PROVIDER not in onnxruntime.get_available_providers():
        return f"{PROVIDER}: registered from {QNN_PACKAGE}, but onnxruntime does not list it"
    return None


def require_qnn() -> None:
    reason = qnn_unavailable_reason()
    if reason is not None:
        raise ExportError(reason)


def qnn_version() -> dict[str, str]:
    """The plugin package's version and the QNN SDK it ships."""
    import onnxruntime_qnn.build_and_package_info as info

    return {"onnxruntime_qnn": info.__version__, "qnn_sdk": getattr(info, "qnn_version", "unknown")}


def htp_session(model_path: Path, provider_options: dict[str, str], config: dict[str, str], model_bytes: bytes | None = None,
                cpu_fallback: bool = False) -> Any:
    """A session with the QNN provider on the HTP backend and CPU fallback disabled: any
    node QNN does not take fails session creation instead of running on the CPU.
    ``model_bytes``, when given, is the model to load (``model_path`` names it in errors).
    ``cpu_fallback``: the CPU takes what QNN does not (to ask where each node went)."""
    import onnxruntime
    import onnxruntime_qnn

    require_qnn()
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if cpu_fallback else "1")
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    devices = [device for device in onnxruntime.get_ep_devices() if device.ep_name == PROVIDER]
    # The graph's input quantization and output dequantization stay in the QNN graph;
    # by default the provider leaves them to the CPU, which fallback-disabled refuses.
    options.add_provider_for_devices(devices, {
        "backend_path": onnxruntime_qnn.get_qnn_htp_path(),
        "offload_graph_io_quantization": "0",
        **provider_options,
    })
    try:
        return onnxruntime.InferenceSession(model_bytes if model_bytes is not None else str(model_path), options)
    except Exception as error:  # onnxruntime's Fail / InvalidGraph
        message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise ExportError(f"{model_path.name}: the QNN HTP backend did not take the whole graph with CPU fallback disabled: {message}") from None


def partitions(session: Any) -> list[dict[str, Any]]:
    """The session's graph assignment: one entry per subgraph, provider and op counts."""
    from collections import Counter

    found = []
    for subgraph in session.get_provider_graph_assignment_info():
        nodes = subgraph.get_nodes()
        found.append({
            "provider": subgraph.ep_name,
            "nodes": len(nodes),
            "ops": dict(sorted(Counter(node.op_type for node in nodes).items())),
        })
    return found


def refused_nodes(session: Any) -> list[dict[str, str]]:
    """The nodes a session with CPU fallback placed off the QNN provider: {node, op_type}."""
    return [{"node": node.name, "op_type": node.op_type}
            for subgraph in session.get_provider_graph_assignment_info() if subgraph.ep_name != PROVIDER
            for node in subgraph.get_nodes()]
