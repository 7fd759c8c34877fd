"""The fixed cost of a worker process: forked from the fork server vs a fresh interpreter.

    .venv/bin/python bench/worker_startup.py [--repeats N] [--baseline REF [--baseline-path DIR] [--rounds N]]

The fixed cost is everything a worker does outside an artifact's recorded phases:
start, import torch, transformers and onnxruntime, open the project, fingerprint the
artifact. It is measured as a ``build`` worker run on an artifact that is already up
to date (it does exactly that, then says "up to date" and exits), from this process
through ``edgebuild.run.workers.run_worker``, alternating the two ways in one run
(``EDGEBUILD_FORK_SERVER=0`` for fresh interpreters); the server's own start is
reported apart (paid once per doit process). Then, end to end, each way, with the remote
cache off: ``doit build`` of eight tiny artifacts from nothing (8 workers: issue 40's
measure), then ``doit verify`` of them from nothing (eight builds and eight verifications:
16 workers). The ways: fresh interpreters, the command's own fork server
(``EDGEBUILD_FORK_SERVER=process``, the default on CI), and a shared fork server (the
default elsewhere) that an earlier command started.

``--baseline REF`` adds issue 40's measure against git REF's edgebuild, a server per
command (the slower default), in ``--rounds`` rounds that alternate the two: the 8 towers
from nothing, per artifact outside the recorded phases. ``--baseline-path DIR`` goes first
on the baseline's ``PYTHONPATH`` as well, for a library as REF had it (a directory that
``pip install --no-deps --target DIR PACKAGE==VERSION`` filled).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from noop_fingerprint import baseline_package  # noqa: E402

EIGHT = """\
checkpoints:
  qwen:
    fixture: qwen3_5_vl_tiny
artifacts:
""" + "".join(
    f"  t{size}:\n    kind: qwen3_5_vision_tower\n    checkpoint: qwen\n    image_size: {size}\n"
    for size in (32, 64, 96, 128, 160, 192, 224, 256)
)
ARTIFACTS = EIGHT.count("kind:")


def fixed_costs(root: Path, repeats: int) -> dict[str, list[float]]:
    from edgebuild.core.config import Settings
    from edgebuild.run import forkserver
    from edgebuild.run.workers import run_worker
    from edgebuild.run.workspace import Workspace

    workspace = Workspace.open(root / "artifacts.yaml", root, Settings.from_environ().replace(remote_cache="off"))
    artifact = workspace.artifact("t64")
    quiet = lambda stream, line: None  # noqa: E731
    started = time.perf_counter()
    run_worker("build", workspace, artifact, quiet)  # the first one starts the server
    first = time.perf_counter() - started
    assert any(server is not None for server in forkserver._SERVERS.values()), "the fork server did not start"
    times: dict[str, list[float]] = {"forked": [], "fresh": [], "first (starts the server)": [first]}
    for _ in range(repeats):
        for way, env in (("forked", dict(os.environ, EDGEBUILD_FORK_SERVER="process")),
                         ("fresh", dict(os.environ, EDGEBUILD_FORK_SERVER="0"))):
            started = time.perf_counter()
            run_worker("build", workspace, artifact, quiet, env=env)
            times[way].append(time.perf_counter() - started)
    return times


def end_to_end(parent: Path) -> dict[str, float]:
    seconds = {}
    # A socket directory of this run's own (0700, as mkdtemp makes it): removing it at the
    # end retires the shared server.
    sockets = tempfile.mkdtemp(prefix="ebfs-")
    shared = {"EDGEBUILD_FORK_SERVER": "shared", "EDGEBUILD_FORK_SERVER_DIR": sockets}
    ways = (("fresh", {"EDGEBUILD_FORK_SERVER": "0"}), ("forked", {"EDGEBUILD_FORK_SERVER": "process"}),
            ("shared", shared))
    try:
        for way, extra in ways:
            seconds |= _from_nothing(parent, way, extra)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    return seconds


def _from_nothing(parent: Path, way: str, extra: dict[str, str]) -> dict[str, float]:
    """``doit build`` of the eight towers from nothing (eight workers: issue 40's measure),
    then ``doit verify`` of them from nothing (sixteen: a build and a verification each),
    after a ``doit build t64`` that generates the fixture (and, shared, leaves the server
    running with the kinds' imports). Each command's wall time and what its steps recorded:
    ``{way} build`` and ``{way} build recorded`` for the build, ``{way}`` and ``{way} recorded``
    for the verify."""
    seconds = {}
    root = common.project_dir(parent / way, EIGHT)
    env = dict(os.environ, EDGEBUILD_REMOTE_CACHE="off", **extra)
    common.run([common.DOIT, "build", "t64"], root, env)  # the fixture, generated once per project
    for command, key in (("build", f"{way} build"), ("verify", way)):
        seconds[key], seconds[f"{key} recorded"] = _timed_from_nothing(root, command, env)
    return seconds


def _timed_from_nothing(root: Path, command: str, env: dict[str, str]) -> tuple[float, float]:
    """``doit COMMAND`` in ``root`` with nothing built, stored or recorded by doit: its wall
    time, and what its builds (and, for ``verify``, verifications) recorded."""
    shutil.rmtree(root / "build")
    shutil.rmtree(root / "cache" / "store", ignore_errors=True)
    (root / "cache" / "doit.json").unlink(missing_ok=True)
    started = time.perf_counter()
    result = common.run([common.DOIT, command], root, env)
    wall = time.perf_counter() - started
    assert result.returncode == 0, result.stdout + result.stderr
    # What the builds and verifications themselves recorded; the rest is fixed cost.
    recorded = 0.0
    built = [directory for directory in (root / "build").iterdir() if not directory.name.startswith(".")]
    assert len(built) == ARTIFACTS, f"doit {command} built {len(built)} artifacts, not {ARTIFACTS}"
    for directory in built:
        recorded += json.loads((directory / ".edgebuild.json").read_text())["build_seconds"]
        if command == "verify":
            recorded += json.loads((directory / "report.json").read_text())["metrics"]["verify_seconds"]
    return wall, recorded


# The first worker of a process, which starts its server: a `build` worker on an up-to-date
# tower, in a process of its own (the fork server lives as long as the process).
FIRST_WORKER = """\
import sys, time
from pathlib import Path
from edgebuild.core.config import Settings
from edgebuild.run.workers import run_worker
from edgebuild.run.workspace import Workspace
root = Path(sys.argv[1])
workspace = Workspace.open(root / "artifacts.yaml", root, Settings.from_environ().replace(remote_cache="off"))
started = time.perf_counter()
run_worker("build", workspace, workspace.artifact("t64"), lambda stream, line: None)
print(time.perf_counter() - started)
"""


def against_baseline(parent: Path, baseline: dict[str, str], rounds: int) -> dict[str, list[float]]:
    """Issue 40's measure with a server per command, now and with ``baseline`` (the
    variables that import the baseline's edgebuild), alternating in each round: per
    artifact, the wall time of ``doit build`` from nothing less what the builds recorded
    (``{way}``); and the first worker of a process, which waits for its server's imports
    (``{way} first``)."""
    ways = {"now": {"EDGEBUILD_FORK_SERVER": "process"},
            "before": {"EDGEBUILD_FORK_SERVER": "process", **baseline}}
    roots = {}
    for way, extra in ways.items():
        roots[way] = common.project_dir(parent / f"baseline-{way}", EIGHT)
        common.run([common.DOIT, "build", "t64"], roots[way], {"EDGEBUILD_REMOTE_CACHE": "off", **extra})
    per_artifact: dict[str, list[float]] = {key: [] for way in ways for key in (way, f"{way} first")}
    for _ in range(rounds):
        for way, extra in ways.items():
            root = roots[way]
            result = common.run([sys.executable, "-c", FIRST_WORKER, str(root)], root,
                                {"EDGEBUILD_REMOTE_CACHE": "off", **extra})
            per_artifact[f"{way} first"].append(float(result.stdout.split()[-1]))
            wall, recorded = _timed_from_nothing(root, "build", {"EDGEBUILD_REMOTE_CACHE": "off", **extra})
            per_artifact[way].append((wall - recorded) / ARTIFACTS)
    return per_artifact


def _installed_in(directory: Path) -> str:
    """What ``pip install --target`` put in ``directory``, as "name version" (not its path:
    the table goes into the repository)."""
    found = sorted(" ".join(entry.name.removesuffix(".dist-info").rsplit("-", 1)) for entry in directory.glob("*.dist-info"))
    return ", ".join(f"`{name}`" for name in found) or "a directory of packages"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", metavar="REF", help="also measure git REF's edgebuild, a server per command")
    parser.add_argument("--baseline-path", metavar="DIR", help="put DIR first on the baseline's PYTHONPATH too")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds against the baseline")
    args = parser.parse_args()
    # Each way names its own; nothing here starts a shared server in the user's directory.
    os.environ["EDGEBUILD_FORK_SERVER"] = "process"
    common.compile_package(common.REPO / "edgebuild")  # as an install does
    parent = Path(tempfile.mkdtemp(prefix="edgebuild-worker-startup-"))
    try:
        root = common.project_dir(parent / "fixed", EIGHT)
        result = common.run([common.DOIT, "build", "t64"], root, dict(os.environ, EDGEBUILD_REMOTE_CACHE="off"))
        assert result.returncode == 0, result.stdout + result.stderr
        os.chdir(root)
        times = fixed_costs(root, args.repeats)
        whole = end_to_end(parent)
        compared = None
        if args.baseline:
            package = baseline_package(args.baseline, parent)
            path = os.pathsep.join([*([args.baseline_path] if args.baseline_path else []), str(package)])
            compared = against_baseline(parent, {"PYTHONPATH": path}, args.rounds)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    forked, fresh = statistics.median(times["forked"]), statistics.median(times["fresh"])
    workers = 2 * ARTIFACTS  # a build and a verification each
    overhead = {way: (whole[way] - whole[f"{way} recorded"]) / workers for way in ("fresh", "forked", "shared")}
    per_artifact = {way: cost * workers / ARTIFACTS for way, cost in overhead.items()}
    # Issue 40's own measure: `doit build` alone, one worker per artifact.
    build_only = {way: (whole[f"{way} build"] - whole[f"{way} build recorded"]) / ARTIFACTS
                  for way in ("fresh", "forked", "shared")}
    rows = [
        ["fresh interpreters (EDGEBUILD_FORK_SERVER=0)", f"{whole['fresh']:.1f}", f"{overhead['fresh']:.2f}",
         f"{per_artifact['fresh']:.2f}", "1.00x"],
        ["forked from the command's fork server (EDGEBUILD_FORK_SERVER=process, the default on CI)", f"{whole['forked']:.1f}", f"{overhead['forked']:.2f}",
         f"{per_artifact['forked']:.2f}", f"{whole['fresh'] / whole['forked']:.2f}x faster"],
        ["forked from a shared fork server already running (EDGEBUILD_FORK_SERVER=shared, the default)", f"{whole['shared']:.1f}",
         f"{overhead['shared']:.2f}", f"{per_artifact['shared']:.2f}", f"{whole['fresh'] / whole['shared']:.2f}x faster"],
    ]
    labels = {"fresh": "fresh interpreters", "forked": "the command's own fork server", "shared": "a shared fork server"}
    build_rows = [[labels[way], f"{whole[f'{way} build']:.1f}", f"{whole[f'{way} build recorded']:.1f}",
                   f"{build_only[way]:.2f}", "met" if build_only[way] <= 1.0 else "not met"]
                  for way in ("fresh", "forked", "shared")]
    markdown = (
        "## Worker fixed cost: forked from a fork server (issue: performance)\n\n"
        f"{common.machine()}. `bench/worker_startup.py`: `doit verify` of {ARTIFACTS} tiny towers from nothing "
        f"({workers} workers: a build and a verification each), the remote cache off, each way in one run. "
        "The fixed cost per worker is the command's wall time less what the builds and verifications "
        "recorded (`build_seconds`, `verify_seconds`), divided by the workers; it includes doit's own "
        "start and planning, shared by all.\n\n"
        + common.table(["workers", "doit verify (s)", "fixed cost per worker (s)", "per artifact (s)", "vs fresh"], rows)
        + f"\n\nIssue 40's measure: `doit build` of the {ARTIFACTS} towers from nothing ({ARTIFACTS} workers), wall "
        "time less the builds' recorded `build_seconds`, per artifact; goal at most 1.0 s.\n\n"
        + common.table(["workers", "doit build (s)", "recorded (s)", "per artifact outside recorded phases (s)",
                        "goal"], build_rows)
        + f"\n\nA `build` worker on an up-to-date tower (start, project, fingerprint; it imports no torch): "
        f"fresh {fresh:.2f} s, forked {forked:.2f} s, median of {args.repeats}; the first worker of a "
        f"process, which starts the server: {times['first (starts the server)'][0]:.2f} s.\n"
        f"\nGoals: at most 1 s per worker outside its recorded phases (issue 25): with the command's own server "
        f"{'met' if overhead['forked'] <= 1.0 else 'not met'} ({overhead['forked']:.2f} s per worker), with a shared "
        f"one {'met' if overhead['shared'] <= 1.0 else 'not met'} ({overhead['shared']:.2f} s); fresh interpreters "
        f"{overhead['fresh']:.2f} s. At most 1 s per artifact, its build and its verification together (issue 40): "
        f"with the command's own server {'met' if per_artifact['forked'] <= 1.0 else 'not met'} "
        f"({per_artifact['forked']:.2f} s), with a shared one {'met' if per_artifact['shared'] <= 1.0 else 'not met'} "
        f"({per_artifact['shared']:.2f} s). The shared server had started in the `doit build` before (it generated "
        "the fixture), as it would have in a developer's earlier command.\n"
    )
    if compared is not None:
        now, before = statistics.median(compared["now"]), statistics.median(compared["before"])
        listed = lambda values: ", ".join(f"{value:.2f}" for value in values)  # noqa: E731
        markdown += (
            f"\nAgainst `{args.baseline}`"
            + (f" (with {_installed_in(Path(args.baseline_path))} first on its `PYTHONPATH`)" if args.baseline_path else "")
            + f", a server per command, {args.rounds} alternated rounds of `doit build` of the {ARTIFACTS} towers "
            f"from nothing: per artifact outside recorded phases, now {now:.2f} s ({listed(compared['now'])}), "
            f"before {before:.2f} s ({listed(compared['before'])}), medians; "
            f"{'met' if now <= 1.0 else 'not met'} now. The first worker of a process, which waits for its "
            f"server's imports (a `build` of an up-to-date tower), in the same rounds: now "
            f"{statistics.median(compared['now first']):.2f} s ({listed(compared['now first'])}), before "
            f"{statistics.median(compared['before first']):.2f} s ({listed(compared['before first'])}).\n"
        )
    print(markdown)
    common.write_section("worker_startup", markdown)


if __name__ == "__main__":
    main()
