"""`doit verify` of many artifacts whose kind does no work: what edgebuild costs per artifact.

    .venv/bin/python bench/verify_many.py [--repeats 3] [--baseline REF]

The kind is a plugin, laid out as pip installs one (a package and its ``.dist-info``, on
``PYTHONPATH``): its build writes one small JSON file (the artifact's index and the
checkpoint's ``vision_config``), its verification reads it back and compares. So what a
``doit verify`` of N of them costs is edgebuild's own: planning, fingerprints, the
workers (or not), the store, the records and reports. Each manifest is one matrix of N
artifacts on the tiny fixture checkpoint (generated once per project, before timing);
each round starts from nothing (no ``build/``, no store, no doit state), the remote cache
off. Per artifact: the command's wall time over N, against a one-artifact ``doit list``
of the same project, in the same rounds. ``--baseline REF`` runs the same commands with
git REF's ``edgebuild`` package first on ``PYTHONPATH``.

Goal (issue 40): at 200 artifacts, at most 0.25x a one-artifact list per artifact, and
flat from 40 to 200 (the per-artifact cost at 200 at most 1.1x the one at 40).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from noop_fingerprint import baseline_package  # noqa: E402

SIZES = (40, 200)
PER_ARTIFACT_GOAL = 0.25
FLAT_GOAL = 1.1

PLUGIN = {
    "__init__.py": '''
from typing import Literal

from edgebuild.plugin import ArtifactKind, ArtifactParams, Process, TensorSelection


class NoteParams(ArtifactParams):
    kind: Literal["bench_note"]
    checkpoint: str
    index: int


class Note(ArtifactKind):
    name = "bench_note"
    summary = "one small JSON file: an index and a checkpoint's vision_config"
    Params = NoteParams
    outputs = ("note.json",)
    build_module = "bench_note.build"
    verify_module = "bench_note.verify"
    process = Process(in_process=IN_PROCESS)

    def tensor_selection(self, params, checkpoint):
        return TensorSelection(prefixes=(), config_key="vision_config")
''',
    "build.py": '''
import json

from edgebuild.plugin import BuildContext


def build(context: BuildContext) -> dict:
    note = {"index": context.params.index, "vision_config": context.checkpoint.config_section("vision_config")}
    (context.out_dir / "note.json").write_text(json.dumps(note, sort_keys=True))
    return {}
''',
    "verify.py": '''
import json

from edgebuild.plugin import Check, Verification, VerifyContext


def verify(context: VerifyContext) -> Verification:
    note = json.loads((context.out_dir / "note.json").read_text())
    same = note == {"index": context.params.index, "vision_config": context.checkpoint.config_section("vision_config")}
    return Verification(checks=[Check.measure("matches", int(same), "==", 1)])
''',
}


def lay_out_plugin(site: Path, in_process: bool = True) -> None:
    (site / "bench_note").mkdir(parents=True)
    for name, text in PLUGIN.items():
        (site / "bench_note" / name).write_text(text.lstrip().replace("IN_PROCESS", str(in_process)))
    info = site / "bench_note-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: bench-note\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[edgebuild.kinds]\nbench_note = bench_note:Note\n")
    (info / "RECORD").write_text("")


def manifest(count: int) -> str:
    return ("checkpoints:\n  qwen:\n    fixture: qwen3_5_vl_tiny\nartifacts:\n  note_{index}:\n    kind: bench_note\n"
            f"    checkpoint: qwen\n    matrix:\n      index: [{', '.join(str(index) for index in range(count))}]\n")


def from_nothing(root: Path) -> None:
    for leftover in (root / "build", root / "cache" / "store"):
        shutil.rmtree(leftover, ignore_errors=True)
    for state in (root / "cache").glob("doit*"):
        state.unlink()


def timed(command: list[str], root: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", metavar="REF", help="also measure git REF's edgebuild, in the same rounds")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgebuild-verify-many-"))
    try:
        site = work / "site"
        lay_out_plugin(site)
        ways = {"now": str(site)}
        if args.baseline:
            ways[args.baseline] = os.pathsep.join([str(baseline_package(args.baseline, work)), str(site)])
        roots = {}
        for count in (1, *SIZES):
            roots[count] = common.project_dir(work / f"n{count}", manifest(count))
            # The fixture checkpoint, generated before anything is timed.
            env = dict(os.environ, PYTHONPATH=str(site), EDGEBUILD_REMOTE_CACHE="off")
            common.run([common.DOIT, "build", "note_0"], roots[count], env)
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for way, path in ways.items():
                env = dict(os.environ, PYTHONPATH=path, EDGEBUILD_REMOTE_CACHE="off")
                samples.setdefault((way, "list"), []).append(timed([common.DOIT, "list"], roots[1], env))
                for count in SIZES:
                    from_nothing(roots[count])
                    samples.setdefault((way, str(count)), []).append(timed([common.DOIT, "verify"], roots[count], env))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {key: statistics.median(values) for key, values in samples.items()}
    rows = []
    for way in ways:
        unit = median[(way, "list")]
        per = {count: median[(way, str(count))] / count for count in SIZES}
        label = "`doit verify` from nothing" + ("" if way == "now" else f" at `{way}` (before)")
        rows.append([label, f"{unit:.2f}"] + [f"{median[(way, str(count))]:.1f} ({per[count]:.3f})" for count in SIZES]
                    + [f"{per[SIZES[-1]] / unit:.2f}x", f"{per[SIZES[-1]] / per[SIZES[0]]:.2f}x"])
    unit = median[("now", "list")]
    per = {count: median[("now", str(count))] / count for count in SIZES}
    ratio, flat = per[SIZES[-1]] / unit, per[SIZES[-1]] / per[SIZES[0]]
    markdown = (
        "## Many artifacts whose kind does no work: `doit verify` per artifact (issue 40)\n\n"
        f"`.venv/bin/python bench/verify_many.py --repeats {args.repeats}"
        + (f" --baseline {args.baseline}" if args.baseline else "") + f"` on {common.machine()}. "
        "A plugin kind whose build writes one small JSON file and whose verification reads it back; one matrix of N "
        "artifacts on the tiny fixture, each `doit verify` from nothing (no `build/`, store or doit state; remote "
        "cache off), a fresh process per command, medians.\n\n"
        + common.table(["command", "one-artifact `doit list` (s)"] + [f"{count} artifacts: s (s per artifact)" for count in SIZES]
                       + [f"per artifact at {SIZES[-1]} vs the list", f"per artifact, {SIZES[-1]} vs {SIZES[0]}"], rows)
        + f"\n\nGoals: per artifact at {SIZES[-1]} at most {PER_ARTIFACT_GOAL}x a one-artifact list: "
        f"{'met' if ratio <= PER_ARTIFACT_GOAL else 'not met'} ({ratio:.2f}x); flat from {SIZES[0]} to {SIZES[-1]} "
        f"(at most {FLAT_GOAL}x): {'met' if flat <= FLAT_GOAL else 'not met'} ({flat:.2f}x).\n"
    )
    print(markdown)
    common.write_section("verify_many", markdown)


if __name__ == "__main__":
    main()
