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
    # An optional extra the kind needs (``qnn``), and the module that shows it is
    # installed: without it the entry is written commented out, saying what to install,
    # so that ``doit verify`` passes right after ``init`` in any installation.
    extra: str | None = None
    extra_module: str | None = None

    def available(self) -> bool:
        import importlib.util

        return self.extra_module is None or importlib.util.find_spec(self.extra_module) is not None

    def text(self) -> str:
        entry = self.entry.rstrip("\n")
        if self.available():
            return entry
        commented = "\n".join(f"  # {line[2:]}" if line.strip() else line for line in entry.splitlines())
        return f"  # Needs the {self.extra!r} extra: pip install 'edgebuild[{self.extra}]', then uncomment.\n{commented}"
