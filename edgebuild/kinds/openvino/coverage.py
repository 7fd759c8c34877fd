"""What OpenVINO's CPU plugin takes of an IR, by its own answer (``Core.query_model``):
the ``openvino_cpu`` coverage certificate of the :data:`OPENVINO_IR` this kind writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgebuild.core.files import RECORD_BYTES, read_json
from edgebuild.core.kind import CoverageTarget, Format
from edgebuild.targets.coverage import Certificate

from .params import INFO_FILE, MODEL_FILE, WEIGHTS_FILE

# Ops that carry no computation: not counted as nodes.
_STRUCTURAL = frozenset({"Parameter", "Result", "Constant"})


def op_module(name: str, modules: dict[str, str]) -> str | None:
    """The model module of an OpenVINO op converted from a ``torch.export`` program: the
    converter names it ``<node>/<aten op>/<op>`` after the program's node."""
    return modules.get(name.split("/", 1)[0])


def query_model_certificate(model_xml: Path, device: str = "CPU", modules: dict[str, str] | None = None) -> Certificate:
    """``query_model`` of the OpenVINO ``device`` plugin on the IR: the ops it takes.
    ``modules``: the program's node -> model module (the build's record)."""
    import openvino

    core = openvino.Core()
    model = core.read_model(str(model_xml))
    placed = core.query_model(model, device)
    ops = [op for op in model.get_ordered_ops() if op.get_type_name() not in _STRUCTURAL]
    taken = [op for op in ops if placed.get(op.get_friendly_name()) == device]
    missing = [op for op in ops if placed.get(op.get_friendly_name()) != device]
    return Certificate(
        target=f"openvino_{device.lower()}", tool=f"openvino Core.query_model({device})",
        tool_version=openvino.get_version(), assumption=f"the {device} plugin installed here, answering for itself",
        nodes_total=len(ops), nodes_taken=len(taken), partitions=1 if taken else 0,
        fallbacks=[{"node": op.get_friendly_name(), "op_type": op.get_type_name(),
                    "module": op_module(op.get_friendly_name(), modules or {})} for op in missing],
    )


def openvino_cpu(directory: Path, memo: dict[str, Any]) -> Certificate:
    """The CPU plugin's answer on the built IR, each op named by the module the build recorded."""
    modules = read_json(directory / INFO_FILE, RECORD_BYTES).get("modules")
    return query_model_certificate(directory / MODEL_FILE, "CPU", modules if isinstance(modules, dict) else None)


OPENVINO_CPU = CoverageTarget("openvino_cpu", "OpenVINO's CPU plugin (query_model on the IR)", f"{__name__}:openvino_cpu",
                              tool_packages=("openvino",), vocabulary="OpenVINO op types")
OPENVINO_IR = Format("openvino_ir", "an OpenVINO IR", (MODEL_FILE, WEIGHTS_FILE, INFO_FILE),
                     certificates=(OPENVINO_CPU,))
