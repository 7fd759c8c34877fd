"""The documentation: its reference pages say what the code says, the site builds with
no broken link and no page left out of its navigation, and the README stays a short
front door into it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def test_the_reference_pages_are_what_the_code_says() -> None:
    checked = subprocess.run([sys.executable, str(REPO / "scripts" / "reference.py"), "--check"],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr


def test_a_stale_reference_page_is_named(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import reference
    finally:
        sys.path.remove(str(REPO / "scripts"))
    made = reference.pages()
    for name, text in made.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert reference.stale(tmp_path) == []
    (tmp_path / "environment.md").write_text(made["environment.md"].replace("EDGEBUILD_JOBS", "EDGEBUILD_WORKERS"))
    (tmp_path / "kinds" / "retired_kind.md").write_text("# gone\n")
    assert reference.stale(tmp_path) == ["environment.md", "kinds/retired_kind.md"]


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a missing anchor or a page not in the
    navigation is a warning, and a warning fails the build."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert built.returncode == 0, built.stdout + built.stderr
    landing = (tmp_path / "site" / "index.html").read_text()
    assert "<title>edgebuild</title>" in landing and "reference/commands/" in landing
    assert (tmp_path / "site" / "reference" / "kinds" / "qwen3_5_vision_tower" / "index.html").is_file()


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    # Every page it links to exists.
    import re

    for target in re.findall(r"\]\((docs/[^)#]+|CHANGELOG\.md|BENCHMARKS\.md)", readme):
        assert (REPO / target).is_file(), target
