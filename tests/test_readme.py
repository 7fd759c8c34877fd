"""What the README says about the code is what the code is."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO


def test_the_layout_in_the_readme_is_the_packages() -> None:
    tree = subprocess.run([sys.executable, str(REPO / "scripts" / "layout.py")], capture_output=True, text=True,
                          check=True).stdout
    assert tree in (REPO / "README.md").read_text(), "README's Layout is stale: paste `python scripts/layout.py`"
