"""The documentation: its reference pages say what the code says, the site builds with
no broken link and no page left out of its navigation, and the README stays a short
front door into it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgebuild.core.config import without_settings

from helpers import REPO, chromium, needs


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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict``: a broken link, a missing anchor or a page not in the
    navigation is a warning, and a warning fails the build."""
    target = tmp_path_factory.mktemp("docs") / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)],
        cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return target


def test_the_site_builds_strictly(site: Path) -> None:
    landing = (site / "index.html").read_text()
    assert "<title>edgebuild</title>" in landing and "reference/commands/" in landing
    assert (site / "reference" / "kinds" / "qwen3_5_vision_tower" / "index.html").is_file()


CHROMIUM = chromium()


# It renders the documentation site in headless Chromium.
@needs("chromium")
def test_the_site_renders_in_a_browser(site: Path, tmp_path: Path) -> None:
    """The landing page and a reference page, as a browser draws them from the files:
    the title, the navigation to every section, and the reference's table."""
    def dom(page: Path) -> str:
        shown = subprocess.run(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
             "--window-size=1400,1000", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120,
        )
        assert shown.returncode == 0, shown.stderr[-2000:]
        return shown.stdout

    landing = dom(site / "index.html")
    assert "<title>edgebuild</title>" in landing
    navigation = re.findall(r'class="md-nav__link[^"]*"[^>]*>\s*(?:<span[^>]*>\s*)?([^<]+?)\s*<', landing)
    for section in ("Getting started", "How-to", "Concepts", "Kinds", "Reference", "Changelog"):
        assert section in navigation, navigation
    commands = dom(site / "reference" / "commands" / "index.html")
    assert "<title>Commands - edgebuild</title>" in commands
    assert re.search(r"<table>.*?<code>--shard SHARD</code>", commands, flags=re.S)
    screenshot = tmp_path / "commands.png"
    subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
                    "--window-size=1400,1000", f"--screenshot={screenshot}", (site / "reference" / "commands" / "index.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    # A blank page compresses to a few kB; this one has a header, navigation and tables.
    assert screenshot.stat().st_size > 40_000


def test_the_readme_is_a_front_door() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    # Every page it links to exists.
    for target in re.findall(r"\]\((docs/[^)#]+|CHANGELOG\.md|BENCHMARKS\.md)", readme):
        assert (REPO / target).is_file(), target


# --- the snippets ----------------------------------------------------------------------------

RUNS = "<!-- runs in the tests -->"
NOT_RUN = re.compile(r"<!-- not run(?: by the snippet tests)?: [^>]+ -->")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    language: str
    marker: str
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    """Every ``python`` and ``sh`` block of the README and the hand-written pages, with
    the HTML comment on the line before it."""
    pages = [REPO / "README.md", *sorted(path for path in (REPO / "docs").rglob("*.md") if "reference" not in path.parts)]
    found = []
    for page in pages:
        text = page.read_text()
        for match in re.finditer(r"^```(python|sh)\n(.*?)^```", text, flags=re.S | re.M):
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found.append(Snippet(str(page.relative_to(REPO)), text[:match.start()].count("\n") + 1, match.group(1),
                                 before if before.startswith("<!--") else "", match.group(2)))
    return found


def test_every_snippet_says_whether_it_runs() -> None:
    """A snippet either runs in the tests or says why not (and which test covers it):
    nothing in the documentation looks runnable without being checked."""
    unmarked = [str(snippet) for snippet in snippets() if snippet.marker != RUNS and not NOT_RUN.fullmatch(snippet.marker)]
    assert unmarked == [], f"mark each with {RUNS} or <!-- not run: why -->: {unmarked}"
    assert len([snippet for snippet in snippets() if snippet.marker == RUNS]) >= 4


@pytest.fixture(scope="module")
def documented_project(verified_seed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A committed copy of the verified seed (a tiny tower ``t`` at 64x64), and what the
    snippets' constants become in it."""
    from helpers import clone_project, git

    root = clone_project(verified_seed, tmp_path_factory.mktemp("documented") / "project").root
    git(root, "init", "-q")
    (root / ".gitignore").write_text("/build/\n/cache/\n")
    git(root, "add", "dodo.py", "artifacts.yaml", "artifacts.lock", ".gitignore")
    git(root, "commit", "-q", "-m", "verified")
    (checkpoint,) = (root / "cache" / "fixtures").glob("qwen3_5_vl_tiny-*")
    return {"root": str(root), "MANIFEST": str(root / "artifacts.yaml"), "ARTIFACT": "t",
            "TOWER": str(root / "build" / "t"), "CHECKPOINT": str(checkpoint)}


@pytest.mark.slow
@pytest.mark.parametrize("snippet", [snippet for snippet in snippets() if snippet.marker == RUNS], ids=str)
def test_the_snippets_that_say_they_run_do(snippet: Snippet, documented_project: dict[str, str]) -> None:
    """Python snippets run with their upper-case constants (``TOWER = "..."``) pointed at
    the project; shell snippets run line by line in it, with this environment's
    ``doit`` and ``python`` first on the PATH."""
    root = Path(documented_project["root"])
    environment = without_settings(os.environ)
    environment |= {"EDGEBUILD_REMOTE_CACHE": "off", "NO_MKDOCS_2_WARNING": "1",
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    if snippet.language == "python":
        def constant(match: re.Match) -> str:
            name = match.group(1)
            assert name in documented_project, f"{snippet}: no value for the constant {name} in the tests"
            return f"{name} = {documented_project[name]!r}"

        code = re.sub(r"^([A-Z][A-Z0-9_]*) = \"[^\"]*\"", constant, snippet.code, flags=re.M)
        # Run from the repository, whose data/ the snippets name.
        ran = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environment, capture_output=True, text=True,
                             timeout=600)
    else:
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", snippet.code], cwd=root, env=environment,
                             capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, f"{snippet}:\n{ran.stdout}\n{ran.stderr}"
    assert "Traceback" not in ran.stderr


def test_every_parameter_of_every_built_in_kind_is_described() -> None:
    """The reference pages' "what" column comes from the field descriptions: none is blank."""
    import importlib

    from edgebuild.core.manifest import ManifestDocument
    from edgebuild.core.registry import BUILTIN_LIST_MODULE, get_kind

    models = [ManifestDocument] + [get_kind(name).Params for name in importlib.import_module(BUILTIN_LIST_MODULE).BUILTIN_KINDS]
    blank = []
    for model in models:
        schema = model.model_json_schema()
        for where, part in [(model.__name__, schema), *schema.get("$defs", {}).items()]:
            blank += [f"{where}.{key}" for key, value in part.get("properties", {}).items()
                      if key != "kind" and not value.get("description")]
    assert blank == []


def test_what_a_kind_is_handed_is_documented_field_by_field() -> None:
    """Every field of ``BuildContext`` and ``VerifyContext`` (a kind's author reads them on
    the API page, which renders ``edgebuild.plugin``) is described in its class's
    docstring: a field added without a word fails here."""
    import dataclasses

    from edgebuild.plugin import BuildContext, VerifyContext

    api_page = (REPO / "docs" / "api.md").read_text()
    assert "::: edgebuild.plugin" in api_page
    for context in (BuildContext, VerifyContext):
        described = {name for cls in context.__mro__ for name in re.findall(r":ivar (\w+):", cls.__doc__ or "")}
        fields = {field.name for field in dataclasses.fields(context)}
        assert fields <= described, (context.__name__, sorted(fields - described))
        assert f"- {context.__name__}" in api_page
