"""Print the package's layout, one line per package and module, from their docstrings.

    python scripts/layout.py            # the tree docs/contributing/layout.md shows

The block in docs/contributing/layout.md is this script's output (``tests/test_readme.py`` holds them
equal), so the layout a newcomer reads is the one the code has.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "edgebuild"
WIDTH = 24


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(docstring.split("\n\n")[0].split())
    if ". " in text:
        text = text[: text.index(". ")]
    # A long first sentence shows its head: what comes before its colon.
    if len(text) > 90 and ": " in text:
        text = text[: text.index(": ")]
    return text.rstrip(".:")


def lines(directory: Path = PACKAGE, depth: int = 0) -> list[str]:
    out = []
    entries = sorted(directory.iterdir(), key=lambda path: (path.is_dir(), path.name))
    for path in entries:
        if path.name.startswith(("_", ".")) and path.name not in ("__init__.py", "__main__.py"):
            continue
        name = path.name + ("/" if path.is_dir() else "")
        indent = "  " * depth
        if path.is_dir() and (path / "__init__.py").is_file():
            # A kind package is one line: what it is; its modules are the kind's own business.
            out.append(f"{indent}{name:<{WIDTH - len(indent)}} {summary(path / '__init__.py')}")
            if directory.name != "kinds":
                out += lines(path, depth + 1)
        elif path.suffix == ".py" and path.name != "__init__.py":
            out.append(f"{indent}{name:<{WIDTH - len(indent)}} {summary(path)}")
    return out


def tree() -> str:
    return "\n".join(["edgebuild/", *("  " + line for line in lines())]) + "\n"


if __name__ == "__main__":
    sys.stdout.write(tree())
