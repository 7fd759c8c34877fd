"""What the README and the documentation say about the code is what the code is."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_the_documented_layout_is_the_packages() -> None:
    tree = subprocess.run([sys.executable, str(REPO / "scripts" / "layout.py")], capture_output=True, text=True,
                          check=True).stdout
    layout = REPO / "docs" / "contributing" / "layout.md"
    assert tree in layout.read_text(), f"{layout.relative_to(REPO)} is stale: paste `python scripts/layout.py`"
