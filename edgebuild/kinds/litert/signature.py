"""The ``.tflite``'s inputs and outputs in the program's order: the converter names them
``serving_default_args_<i>`` and ``serving_default_output_<i>...`` after their place in the
program, and the interpreter lists them in an order of its own."""

from __future__ import annotations

import re
from typing import Any


def in_program_order(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The interpreter's input or output details, sorted by their place in the program."""
    return sorted(details, key=lambda item: position(item["name"]))


def position(name: str) -> int:
    """The index in ``serving_default_args_3`` or ``StatefulPartitionedCall:3``-like names."""
    found = re.findall(r"\d+", name)
    return int(found[-1]) if found else 0
