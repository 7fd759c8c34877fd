"""Runners the kinds share: an ONNX graph on onnxruntime's CPU provider, and a PyTorch
module (the float model a chain is judged against) in float32."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from edgebuild.core.runner import Feed, Outputs, Runner, TensorSpec
from edgebuild.ml.taps import onnx_taps, torch_taps

if TYPE_CHECKING:
    import torch

# onnxruntime's element types -> NumPy's dtype names.
_ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64", "tensor(int64)": "int64",
    "tensor(int32)": "int32", "tensor(bool)": "bool", "tensor(uint8)": "uint8", "tensor(int8)": "int8",
}


def session_runner(session: Any, description: str, simulated: bool = False,
                   on_threads: "Callable[[int], Runner] | None" = None) -> Runner:
    """A runner of an onnxruntime ``session`` (inputs and outputs as the graph declares
    them); ``simulated`` for a session on a simulator of the device."""
    inputs = [TensorSpec(item.name, tuple(dim if isinstance(dim, int) else None for dim in item.shape),
                         _ORT_TYPES.get(item.type, item.type)) for item in session.get_inputs()]
    outputs = [item.name for item in session.get_outputs()]

    def run_one(feed: Feed) -> Outputs:
        return dict(zip(outputs, session.run(outputs, feed)))

    return Runner(description, inputs, outputs, run_one, simulated=simulated, threads=_session_threads(session),
                  on_threads=on_threads)


def onnx_runner(path: Path, threads: int | None = None) -> Runner:
    """The graph at ``path`` on onnxruntime's CPU provider (on ``threads`` intra-op threads
    and one inter-op thread; ``None``: onnxruntime's default)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    runner = session_runner(session, f"onnxruntime {onnxruntime.__version__} CPUExecutionProvider ({path.name})",
                            on_threads=lambda count: onnx_runner(path, count))
    if path.suffix == ".onnx":
        # An ONNX graph can be given extra outputs; an ORT file cannot.
        runner.module_outputs = onnx_taps(path, threads)
    return runner


def torch_runner(forward: Callable[..., Any], inputs: list[TensorSpec], outputs: list[str], description: str,
                 model: "torch.nn.Module | None" = None) -> Runner:
    """A runner of ``forward``, called with one tensor per input (in ``inputs``' order)
    under ``torch.no_grad`` and returning one tensor per output (a tuple, or one tensor
    for one output): floating inputs go in as float32, outputs come out as float32.
    ``model``: the module ``forward`` runs, whose modules' ends it shows (``module_outputs``);
    by default ``forward`` itself where it is a module."""

    def run_one(feed: Feed) -> Outputs:
        import torch

        tensors = [_tensor(feed[spec.name]) for spec in inputs]
        with torch.no_grad():
            result = forward(*tensors)
        values = result if isinstance(result, (tuple, list)) else (result,)
        return {name: _float32(value) for name, value in zip(outputs, values)}

    import torch

    def on_threads(count: int) -> Runner:
        # torch's thread count is the process's: set while the pinned runner is open (not
        # in each timed run: resizing OpenMP's pool is not the model's time), put back on close.
        before = torch.get_num_threads()
        torch.set_num_threads(count)
        return Runner(description, inputs, outputs, run_one, threads=count,
                      close=lambda: torch.set_num_threads(before))

    tapped = model if model is not None else forward if isinstance(forward, torch.nn.Module) else None
    taps = None
    if tapped is not None:
        def call(feed: Feed) -> Any:
            return forward(*(_tensor(feed[spec.name]) for spec in inputs))

        taps = torch_taps(tapped, call)
    return Runner(description, inputs, outputs, run_one, threads=torch.get_num_threads(), on_threads=on_threads,
                  module_outputs=taps)


def _tensor(array: Any) -> "torch.Tensor":
    import numpy
    import torch

    tensor = torch.from_numpy(numpy.ascontiguousarray(array))
    return tensor.float() if tensor.is_floating_point() else tensor


def _session_threads(session: Any) -> int | None:
    """The intra-op threads a session was given; ``None`` when it takes onnxruntime's default."""
    try:
        threads = session.get_session_options().intra_op_num_threads
    except AttributeError:
        return None
    return threads if isinstance(threads, int) and threads > 0 else None


def _float32(value: "torch.Tensor") -> Any:
    return value.detach().float().numpy()
