"""The report page: build/index.html shows every artifact, its state and checks, and
draws each kind's plots as inline SVG; the browser test renders it in headless Chromium."""

from __future__ import annotations

import datetime
import html
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgebuild.core.project import BuildGraph
from edgebuild.run.workspace import Workspace
from edgebuild.core.record import output_manifest
from edgebuild.core.report import Check, Report
from edgebuild.cli.report_page import PAGE_FILE, render_report_page, write_report_page
from edgebuild.core.figures import heatmap_svg, histogram_svg
from edgebuild.kinds.siglip_f143_onnx.figures import fp8_size_breakdown
from helpers import TOWER_MANIFEST, chromium, clone_project, lay_out_siglip_inputs, needs

GENERATED_AT = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
CHROMIUM = chromium()
BROWSER_TIMEOUT_S = 120

SIGLIP_ARTIFACTS = """\
  siglip:
    path: ckpt
artifacts:
  q:
    kind: siglip_f143
    checkpoint: siglip
    description: "tiny SigLIP <b>F143</b>"
    calibration:
      images: ["images/*.png"]
    held_out:
      images: ["held_out/*.png"]
  q_onnx:
    kind: siglip_f143_onnx
    source: q
"""

# Measured on a real build of the tiny SigLIP fixture (two layers, six linears each).
OBJECTIVES = {
    "self_attn.k_proj": (93.44, 20.54), "self_attn.v_proj": (81.84, 17.77), "self_attn.q_proj": (70.90, 15.13),
    "self_attn.out_proj": (71.86, 8.525), "mlp.fc1": (263.0, 70.84), "mlp.fc2": (82.55, 13.48),
}
LINEAR_SHAPES = {"self_attn.k_proj": [96, 96], "self_attn.v_proj": [96, 96], "self_attn.q_proj": [96, 96],
                 "self_attn.out_proj": [96, 96], "mlp.fc1": [160, 96], "mlp.fc2": [96, 160]}
FP8_CODE_BYTES, FP8_SCALE_BYTES = 135168, 11008


def _siglip_project(root: Path, siglip_checkpoint: Path, tower: bool) -> BuildGraph:
    """A manifest with the two SigLIP artifacts and, with ``tower``, the tower ``t``."""
    lay_out_siglip_inputs(root, siglip_checkpoint)
    tower_part = TOWER_MANIFEST.split("artifacts:\n")
    manifest = (tower_part[0] + SIGLIP_ARTIFACTS + tower_part[1]) if tower else "checkpoints:\n" + SIGLIP_ARTIFACTS
    (root / "artifacts.yaml").write_text(manifest)
    return Workspace.open(root / "artifacts.yaml", root)


def _write_built(project: BuildGraph, name: str, files: dict[str, Any], checks: list[Check], metrics: dict[str, Any]) -> None:
    """Lay out ``build/<name>`` as a build and its verification would: the files, a record at
    the current fingerprint, a report at the current verification fingerprint."""
    directory = project.layout.artifact_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    for relative, content in files.items():
        (directory / relative).write_text(content if isinstance(content, str) else json.dumps(content))
    record = project.artifact(name).record
    record.completed(name, {}, 1.0, output_manifest(directory)).write(directory)
    Report(
        artifact=name, kind=record.kind, fingerprint=record.fingerprint,
        checks=[Check.measure("outputs_intact", len(files), "==", len(files)), *checks], metrics=metrics,
        extra={"verify_fingerprint": project.artifact(name).verify_fingerprint,
               "verify": project.manifest.artifacts[name].verify_parameters()},
    ).write(directory)


def _write_siglip_builds(project: BuildGraph, held_out_cosines: tuple[float, float] = (0.99917, 0.99960)) -> None:
    objectives = {f"encoder.layers.{layer}.{linear}": {"nearest": nearest, "reconstructed": reconstructed,
                                                       "ratio": reconstructed / nearest, "bias_correction_rms": 0.005}
                  for layer in range(2) for linear, (nearest, reconstructed) in OBJECTIVES.items()}
    quantization = {"objectives": objectives, "objective_ratio": 0.3121, "quantized_linears": [f"{name}.weight" for name in objectives]}
    _write_built(
        project, "q", {"quantization.json": quantization},
        [Check.measure("calibration.cosine", 0.99924, ">=", 0.99, "quantized vs float, worst batch"),
         Check.measure("held_out.cosine", min(held_out_cosines), ">=", 0.99, "quantized vs float, worst batch")],
        {"image_cosines": {"calibration": [0.99924, 0.99912, 0.99942, 0.99920], "held_out": list(held_out_cosines)}},
    )
    rewritten = {f"encoder.layers.{layer}.{linear}.weight": {"axis": 0, "initializer": f"val_{layer}_{linear}", "shape": shape}
                 for layer in range(2) for linear, shape in LINEAR_SHAPES.items()}
    export = {"dtype": "float32", "weights": "fp8", "rewritten": rewritten, "graph_bytes": 775640, "float_graph_bytes": 1169711}
    _write_built(
        project, "q_onnx", {"export.json": export},
        [Check.measure("quantized_weight_ratio", (FP8_CODE_BYTES + FP8_SCALE_BYTES) / (4 * FP8_CODE_BYTES), "<=", 0.3),
         Check.measure("vs_float.last_hidden_state.cosine", 0.99916, ">=", 0.99)],
        {"inputs": "2 held_out images of q",
         "vs_float": {"measured": True, "inputs": "2 held_out images of q",
                      "cosines": {"last_hidden_state": [0.99916, 0.99960]}}},
    )


def _write_tower_build(project: BuildGraph, max_abs: float) -> None:
    """``t`` as the tower's verification writes it, with a max_abs check at 1e-4."""
    edges = [10.0 ** (exponent / 2) for exponent in range(-16, 5)]
    counts = [0] * (len(edges) + 1)
    counts[5:9] = [40, 300, 400, 28]
    _write_built(
        project, "t", {"tower.json": {"merged_tokens": 4}},
        [Check.measure("max_abs", max_abs, "<=", 1e-4, "onnxruntime vs <forward>")],
        {"token_errors": {"grid": [2, 2], "max_abs": [1e-6, 2e-6, 4e-7, max_abs],
                          "histogram": {"edges": edges, "counts": counts}}},
    )


def _sections(page: str) -> dict[str, str]:
    """Each artifact section's HTML, by artifact name."""
    found = re.findall(r'<section class="artifact" id="[^"]+" data-artifact="([^"]+)">(.*?)</section>', page, re.S)
    return {html.unescape(name): body for name, body in found}


# --- the page, read as text -------------------------------------------------------------

@pytest.fixture
def handmade(tmp_path: Path, siglip_checkpoint: Path) -> BuildGraph:
    """Tower, SigLIP and FP8 graph artifacts laid out by hand (a failing tower among them)."""
    project = _siglip_project(tmp_path, siglip_checkpoint, tower=True)
    _write_siglip_builds(project)
    _write_tower_build(project, max_abs=3e-4)
    return project


def test_every_artifact_with_its_state_checks_and_plots(handmade: BuildGraph) -> None:
    path = write_report_page(handmade, GENERATED_AT)
    assert path == handmade.layout.build_dir / PAGE_FILE
    page = path.read_text()
    sections = _sections(page)
    assert list(sections) == ["q", "q_onnx", "t"]
    for name in sections:
        assert f"<code title=\"{handmade.artifact(name).fingerprint}\">{handmade.artifact(name).fingerprint[:12]}</code>" in sections[name]
    assert '<span class="state good">verified</span>' in sections["q"]
    assert '<span class="state bad">verification failed</span>' in sections["t"]
    # A failed check is marked, with its value and limit.
    assert re.search(r'<tr class="fail"><td>max_abs.*?3\.000e-04.*?&lt;= 1\.000e-04.*?FAIL', sections["t"], re.S)
    # Tower: a heatmap cell per merged token, the one above the limit outlined; a bar per histogram bin.
    assert sections["t"].count('class="cell"') == 4
    assert sections["t"].count('stroke="#c62828" stroke-width="2"') == 1
    assert sections["t"].count('<rect class="bar"') == 22
    # SigLIP: two bars per linear; a bar per image.
    assert sections["q"].count("<svg") == 2
    assert sections["q"].count("<title>encoder.layers.") == 24
    assert sections["q"].count("image 0: cosine") == 2 and sections["q"].count("held_out image") == 2
    # FP8 graph: the size breakdown and the per-image cosines.
    assert "FP8 codes: 135 kB" in sections["q_onnx"] and "scales: 11 kB" in sections["q_onnx"]
    assert sections["q_onnx"].count("<svg") == 2
    assert 'generated at 2025-01-02T03:04:05+00:00' in page
    assert "<script" not in page.lower()


def test_the_page_is_the_same_for_the_same_inputs_but_its_time(handmade: BuildGraph) -> None:
    first = render_report_page(handmade, GENERATED_AT)
    assert render_report_page(Workspace.open(handmade.manifest.path, handmade.layout.root), GENERATED_AT) == first
    later = render_report_page(handmade, GENERATED_AT + datetime.timedelta(hours=1))
    assert [line for line in first.splitlines() if "generated at" not in line] == \
        [line for line in later.splitlines() if "generated at" not in line]


def test_text_from_the_manifest_and_reports_is_escaped(handmade: BuildGraph) -> None:
    page = render_report_page(handmade, GENERATED_AT)
    assert "tiny SigLIP &lt;b&gt;F143&lt;/b&gt;" in page and "<b>" not in page
    assert "onnxruntime vs &lt;forward&gt;" in page


SCRIPT = "<script>alert(1)</script>"


def test_markup_in_any_text_is_escaped_everywhere_on_the_page(handmade: BuildGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """The templates escape every value: markup in the manifest, in a plugin's report (a
    check's detail, latency, coverage), in its figures and notes, and in ``doit diff``'s
    words shows as text. Only the SVG a kind draws goes in as markup."""
    import edgebuild.cli.report_page.page as report_page
    import edgebuild.kinds.qwen3_5_tower.figures as tower_figures
    from edgebuild.core.figures import Figure, Plots
    from edgebuild.run.diff import ArtifactDiff, CheckChange, Diff, OutputChange

    manifest = handmade.manifest.path
    manifest.write_text(manifest.read_text().replace('"tiny SigLIP <b>F143</b>"', json.dumps(SCRIPT)))
    directory = handmade.layout.artifact_dir("t")
    report = json.loads((directory / "report.json").read_text())
    report["checks"][1]["detail"] = SCRIPT
    report["latency"] = {"measured": False, "reason": SCRIPT}
    report["coverage"] = {"directml": {"nodes_taken": 1, "nodes_total": 2, "partitions": 1, "fallbacks": [{"node": SCRIPT}],
                                       "tool": SCRIPT, "tool_version": "1", "assumption": SCRIPT}}
    report["coverage_not_computed"] = {"nnapi": SCRIPT}
    (directory / "report.json").write_text(json.dumps(report))
    svg = '<svg class="plot"><rect class="cell"/></svg>'
    monkeypatch.setattr(tower_figures, "tower_figures", lambda *arguments: Plots([Figure(SCRIPT, svg, SCRIPT)], [SCRIPT]))
    changed = ArtifactDiff("t", "qwen3_5_vision_tower", "changed", "a" * 64, "b" * 64, reasons=(SCRIPT,),
                           outputs=(OutputChange(SCRIPT, 1, 2, True),),
                           checks=(CheckChange(SCRIPT, 1.0, 2.0, 1.0, "<=", 3.0, True, True),), notes=(SCRIPT,))
    monkeypatch.setattr(report_page, "_compared_with_head",
                        lambda workspace: (Diff(SCRIPT, None, (changed,)), f"compared with {SCRIPT}"))

    page = render_report_page(Workspace.open(manifest, handmade.layout.root), GENERATED_AT)
    assert "<script" not in page.lower()
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    # The note at the top and the revision in the summary table.
    assert page.split('<section class="artifact"')[0].count(escaped) == 2
    assert _sections(page)["q"].count(escaped) == 1  # the description
    # The diff (revision, reason, output, check, note), the check's detail, latency, coverage
    # (a node, the tool, its assumption, the summary's counts don't hold it, why not computed),
    # the figure (in the list, its title, its caption) and the note.
    assert _sections(page)["t"].count(escaped) == 5 + 1 + 1 + 4 + 3 + 1
    assert f"<figcaption>{escaped}</figcaption>{svg}" in page


def test_the_templates_ship_with_the_package() -> None:
    """Every file of the package that is not Python is package data (pyproject.toml), so
    an install (not only this checkout) has the report page's templates."""
    import tomllib
    from fnmatch import fnmatch

    from helpers import REPO

    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = REPO / "edgebuild"
    data = [path for path in package.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts]
    assert {path.relative_to(REPO).as_posix() for path in data} >= {
        "edgebuild/cli/report_page/templates/report_page.html.j2",
        "edgebuild/cli/report_page/templates/report_parts.html.j2"}
    for path in data:
        owners = [(name, globs) for name, globs in package_data.items() if path.is_relative_to(REPO / name.replace(".", "/"))]
        assert any(fnmatch(path.relative_to(REPO / name.replace(".", "/")).as_posix(), pattern)
                   for name, globs in owners for pattern in globs), f"{path.relative_to(REPO)} is not package data"


def test_artifacts_not_built_or_with_unreadable_files_still_have_their_section(
        tmp_path: Path, siglip_checkpoint: Path) -> None:
    project = _siglip_project(tmp_path, siglip_checkpoint, tower=False)
    _write_siglip_builds(project)
    (project.layout.artifact_dir("q") / "quantization.json").write_text("{not json")
    (project.layout.artifact_dir("q_onnx") / "export.json").write_text('{"weights": "fp8", "rewritten": {"w": {}}}')
    sections = _sections(render_report_page(project, GENERATED_AT))
    assert "quantization.json: not valid JSON: Expecting property name" in sections["q"]
    # The edits changed outputs: the page says what doit status says.
    assert '<span class="state warn">stale</span>' in sections["q"]
    assert "could not draw this artifact&#39;s plots: KeyError: &#39;shape&#39;</p>" in sections["q_onnx"]
    # The rest of the section is still there.
    assert "quantized_weight_ratio" in sections["q_onnx"] and "<svg" not in sections["q_onnx"]
    (project.layout.artifact_dir("q_onnx") / "report.json").unlink()
    sections = _sections(render_report_page(project, GENERATED_AT))
    assert "no verification report yet: <code>doit verify q_onnx</code>" in sections["q_onnx"]


def test_a_stale_artifact_shows_its_builds_checks_as_that_builds(handmade: BuildGraph) -> None:
    built = handmade.fingerprint(handmade.artifact("q"))
    images = handmade.layout.root / "images"
    shutil.copy(sorted(images.iterdir())[0], images / "zz_more.png")  # one more calibration image
    project = Workspace.open(handmade.manifest.path, handmade.layout.root)
    assert project.fingerprint(project.artifact("q")) != built
    page = render_report_page(project, GENERATED_AT)
    section = _sections(page)["q"]
    assert '<span class="state warn">stale</span>' in section
    # The checks shown are the build's in build/, labelled with that build's fingerprint.
    assert f'build/ holds an earlier build (<code title="{built}">{built[:12]}</code>), not the current fingerprint' in section
    assert "held_out.cosine" in section
    # The summary pairs no fingerprint with another build's checks: none counted for q.
    overview = page.split('<section class="overview">')[1].split("</section>")[0]
    row = re.search(r'<tr><td><a href="#artifact-0">q</a></td>(.*?)</tr>', overview).group(1)
    assert row.endswith("<td>&ndash;</td><td>&ndash;</td><td>&ndash;</td>") and "stale" in row
    verified = re.search(r'<tr><td><a href="#artifact-1">q_onnx</a></td>(.*?)</tr>', overview).group(1)
    assert "stale" in verified or "missing" in verified
    failed = re.search(r'<tr><td><a href="#artifact-2">t</a></td>(.*?)</tr>', overview).group(1)
    assert '<span class="state bad">verification failed</span>' in failed and "<td>1 / 2</td>" in failed


def test_fp8_size_breakdown_adds_up() -> None:
    rewritten = {f"w{index}": {"shape": [96, 96]} for index in range(2)}
    codes, scales = 2 * 96 * 96, 2 * 96 * 2 * 4
    report = {"checks": [{"name": "quantized_weight_ratio", "value": (codes + scales) / (4 * codes)}]}
    breakdown = fp8_size_breakdown({"dtype": "float32", "weights": "fp8", "rewritten": rewritten,
                                    "graph_bytes": 200_000, "float_graph_bytes": 300_000}, report)
    assert breakdown == {
        "graph with float32 weights": {"quantized weights": 4 * codes, "everything else": 300_000 - 4 * codes},
        "graph with FP8 weights": {"FP8 codes": codes, "scales": scales, "everything else": 200_000 - codes - scales},
    }
    assert fp8_size_breakdown({"weights": "float", "rewritten": {}, "graph_bytes": 1, "float_graph_bytes": 1}, report) is None


def test_plots_are_well_formed_svg() -> None:
    import xml.etree.ElementTree as ElementTree

    heatmap = ElementTree.fromstring(heatmap_svg([0.0, 1e-6, float("nan"), 2e-3], 2, 2, "g", limit=1e-3))
    cells = [element for element in heatmap.iter("{http://www.w3.org/2000/svg}rect") if element.get("class") == "cell"]
    assert [cell.get("fill") for cell in cells][2] == "#ff00ff"  # NaN stands out
    assert [cell.get("stroke") for cell in cells] == [None, None, "#c62828", "#c62828"]
    edges = [1e-6, 1e-5]
    histogram = ElementTree.fromstring(histogram_svg(edges, [0, 5, 1], limit=5e-6))
    assert len([element for element in histogram.iter("{http://www.w3.org/2000/svg}rect")]) == 3
    with pytest.raises(ValueError, match="2 edges need 3 counts, found 2"):
        histogram_svg(edges, [1, 2])


def test_writing_the_page_imports_no_model_library(handmade: BuildGraph) -> None:
    code = ("import sys; from edgebuild.run.workspace import Workspace; from edgebuild.cli.report_page import write_report_page; "
            f"write_report_page(Workspace.open({str(handmade.manifest.path)!r}, {str(handmade.layout.root)!r})); "
            "print(sorted(name for name in ('torch', 'onnx', 'onnxruntime', 'numpy', 'transformers') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# --- real builds -------------------------------------------------------------------------

@pytest.mark.slow
def test_the_siglip_verifications_record_what_the_page_draws(tmp_path: Path, siglip_checkpoint: Path) -> None:
    from edgebuild.run.builder import make_current, verify_artifact

    project = _siglip_project(tmp_path, siglip_checkpoint, tower=False)
    quiet = lambda message: None  # noqa: E731
    for name in ("q", "q_onnx"):
        make_current(project, project.artifact(name), log=quiet)
    report = verify_artifact(project, project.artifact("q"), log=quiet)
    verify_artifact(project, project.artifact("q_onnx"), log=quiet)
    cosines = report.metrics["image_cosines"]
    assert [len(cosines["calibration"]), len(cosines["held_out"])] == [4, 2]
    for label in ("calibration", "held_out"):
        # The check is the worst batch's mean over its images.
        assert min(cosines[label]) <= report.metrics["outputs"][label]["cosine"] <= max(cosines[label])
    sections = _sections(render_report_page(project, GENERATED_AT))
    assert sections["q"].count("<svg") == 2 and sections["q_onnx"].count("<svg") == 2
    assert "FP8 codes: 135 kB" in sections["q_onnx"] and "scales: 11 kB" in sections["q_onnx"]


# Run by the browser test in a copy of the page (the page itself has no script): the
# rendered size of every SVG of every artifact section, details unfolded, written into the DOM.
LAYOUT_PROBE = """<script>
document.querySelectorAll("details").forEach(element => { element.open = true; });
const sections = [...document.querySelectorAll("section.artifact")].map(section => ({
  name: section.dataset.artifact,
  svgs: [...section.querySelectorAll("svg")].map(svg => { const box = svg.getBoundingClientRect(); return [box.width, box.height]; }),
}));
const probe = document.createElement("pre");
probe.id = "layout-probe";
probe.textContent = JSON.stringify(sections);
document.body.appendChild(probe);
</script>"""


def _chromium(*arguments: str, profile: Path) -> subprocess.CompletedProcess[str]:
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
               f"--user-data-dir={profile}", "--window-size=1400,2000", *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S)
    assert result.returncode == 0, f"chromium exited {result.returncode}: {result.stderr[-2000:]}"
    return result


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow
# It renders build/index.html in headless Chromium.
@needs("chromium")
def test_the_page_renders_in_a_browser(verified_seed: Path, tmp_path: Path, siglip_checkpoint: Path) -> None:
    clone = clone_project(verified_seed, tmp_path / "project")
    project = _siglip_project(clone.root, siglip_checkpoint, tower=True)
    _write_siglip_builds(project, held_out_cosines=(0.98, 0.99960))
    page = write_report_page(project, GENERATED_AT)

    tower = json.loads((project.layout.artifact_dir("t") / "report.json").read_text())
    errors = tower["metrics"]["token_errors"]
    max_abs = next(check["value"] for check in tower["checks"] if check["name"] == "max_abs")
    # The real tower verification: a 2x2 grid of merged tokens at 64x64, 2 samples x 4 tokens x 96 values binned.
    assert errors["grid"] == [2, 2] and len(errors["max_abs"]) == 4
    assert max(errors["max_abs"]) == pytest.approx(max_abs, rel=1e-3)
    assert sum(errors["histogram"]["counts"]) == 2 * 4 * 96

    probe_page = page.with_name("layout-probe.html")
    probe_page.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = _chromium("--dump-dom", probe_page.as_uri(), profile=tmp_path / "profile").stdout
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', dom, re.S)
    assert found, f"the layout probe did not run; the DOM ends: {dom[-500:]}"
    layout = {section["name"]: section["svgs"] for section in json.loads(html.unescape(found.group(1)))}
    assert list(layout) == ["q", "q_onnx", "t"]
    assert {name: len(svgs) for name, svgs in layout.items()} == {"q": 2, "q_onnx": 2, "t": 2}
    assert all(width > 50 and height > 50 for svgs in layout.values() for width, height in svgs), layout
    assert '<span class="state good">verified</span>' in _sections(dom)["t"]
    # The held-out image below the limit is drawn in the failure colour.
    assert _sections(dom)["q"].count('fill="#c62828"><title>held_out image 0') == 1

    screenshot = tmp_path / "report_page.png"
    _chromium(f"--screenshot={screenshot}", page.as_uri(), profile=tmp_path / "profile")
    assert _png_size(screenshot) == (1400, 2000)
    # A blank page compresses to a few kB; this one has tables and plots.
    assert screenshot.stat().st_size > 50_000


@pytest.mark.slow
def test_doit_report_writes_the_page_beside_the_manifest(verified_seed: Path, tmp_path: Path) -> None:
    project = clone_project(verified_seed, tmp_path / "p")
    (project.root / "sub").mkdir()
    # From a subdirectory, as a user in their own repository would.
    result = subprocess.run(
        [str(Path(sys.executable).with_name("doit")), "-k", "report"], cwd=project.root / "sub",
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    page = project.root / "build" / "index.html"
    assert result.stdout == f"{page}\n"
    assert 'data-artifact="t"' in page.read_text()
