"""What ``python -m edgebuild init`` writes for a kind (see ``edgebuild/scaffold.py``).

Apart from the scaffold, which lists every kind, so that a kind declares its
starter without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Starter:
    """One artifact entry on a generated checkpoint: its YAML (two spaces in under
    ``artifacts:``, comments welcome) and the checkpoints it names, each as manifest
    name -> the generated fixture it falls back to."""

    entry: str
    checkpoints: dict[str, str] = field(default_factory=dict)
