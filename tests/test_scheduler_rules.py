"""The scheduler's rules (edgebuild/run/scheduler.py), fast: what needs building, what
needs only verifying, what a failure blocks, and what the run records, in which order.

Nothing is exported: the artifacts are of a tiny real kind, registered in this process,
whose build writes one small file (a word of its parameters, then its sources' files)
and whose verification passes unless its parameters say otherwise. The scheduler's own
loop decides; its steps run here, in this process (``make_current`` and
``verify_artifact``, which a worker process runs for the default steps), each call
written down, so a test says what the loop chose to do and in which order."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from edgebuild.core import registry
from edgebuild.core.config import Settings
from edgebuild.plugin import ArtifactKind, ArtifactParams, Format
from edgebuild.run.builder import make_current, verify_artifact
from edgebuild.run.executors.base import Executor, Job, Outcome, WorkerOffer
from edgebuild.run.scheduler import Outcomes, needs_a_worker, needs_build, needs_verify, run
from edgebuild.run.state import VerificationState, verification_state
from edgebuild.run.workspace import Workspace

KIND = "scheduler_rules_step"
# The kind's build and verify module, written out by the fixture below (a kind's modules
# are imported by name, and their code is in its fingerprints).
STEP_MODULE = "scheduler_rules_step"
STEP_CODE = '''
from edgebuild.plugin import Check, ExportError, Verification


def build(context):
    if context.params.fails == "build":
        raise ExportError(f"{context.name}: its parameters say the build fails")
    made_from = [(directory / "made.txt").read_text() for directory in context.sources.values()]
    (context.out_dir / "made.txt").write_text(" + ".join([context.params.writes, *made_from]))
    return {}


def verify(context):
    return Verification(checks=[Check.measure("told_to_pass", int(context.params.fails != "verify"), "==", 1)])
'''


class StepParams(ArtifactParams):
    kind: Literal["scheduler_rules_step"]
    # What its build writes before its sources' files. The artifact's name is in no
    # fingerprint: two artifacts alike in everything else are one build.
    writes: str
    # Several sources make a diamond (built-in kinds take one ``source:``).
    sources: list[str] = Field(default_factory=list)
    fails: Literal["build", "verify"] | None = None

    def source_artifacts(self) -> list[str]:
        return list(self.sources)


class Step(ArtifactKind):
    name = KIND
    summary = "one small file: a word and its sources' files"
    Params = StepParams
    outputs = ("made.txt",)
    build_module = verify_module = STEP_MODULE
    produces = consumes = (Format("step_file", "a step's small file"),)


@pytest.fixture(scope="module", autouse=True)
def step_kind(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("kind")
    (directory / f"{STEP_MODULE}.py").write_text(STEP_CODE)
    sys.path.insert(0, str(directory))
    registry.register(Step)
    yield
    registry.unregister(KIND)
    sys.path.remove(str(directory))
    sys.modules.pop(STEP_MODULE, None)


def open_workspace(root: Path, artifacts: str) -> Workspace:
    """A project at ``root`` with these ``artifacts:`` entries, no remote cache."""
    (root / "artifacts.yaml").write_text("artifacts:\n" + textwrap.indent(textwrap.dedent(artifacts), "  "))
    return Workspace.open(root / "artifacts.yaml", root)


class Steps:
    """The scheduler's steps, done in this process, each call written down as
    ``(step, artifact)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def build(self, workspace: Workspace, artifact, log, relay) -> None:
        self.calls.append(("build", artifact.name))
        make_current(workspace, artifact, log)

    def verify(self, workspace: Workspace, artifact, log, relay) -> None:
        self.calls.append(("verify", artifact.name))
        verify_artifact(workspace, artifact, log)


def run_here(workspace: Workspace, names: list[str], verify_them: bool, fail_fast: bool = False) -> tuple[Outcomes, list]:
    """``run`` of ``names`` with the steps in this process: its outcomes and the steps' calls."""
    steps = Steps()
    outcomes = run(workspace, [workspace.artifact(name) for name in names], verify_them, fail_fast,
                   build_step=steps.build, verify_step=steps.verify)
    return outcomes, steps.calls


def failing(artifacts: str, name: str, step: Literal["build", "verify"]) -> str:
    """``artifacts`` with ``name``'s ``step`` failing."""
    return artifacts.replace(f"writes: {name}", f"writes: {name}, fails: {step}")


CHAIN = """\
a: {kind: scheduler_rules_step, writes: a}
b: {kind: scheduler_rules_step, writes: b, sources: [a]}
c: {kind: scheduler_rules_step, writes: c, sources: [b]}
"""


def test_an_artifact_never_built_is_built_then_verified(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, "a: {kind: scheduler_rules_step, writes: a}\n")
    a = workspace.artifact("a")
    assert needs_build(workspace, a) and needs_verify(workspace, a)
    outcomes, calls = run_here(workspace, ["a"], verify_them=True)
    assert calls == [("build", "a"), ("verify", "a")]
    assert (outcomes.succeeded, outcomes.failed) == ({"a", "verify:a"}, {})
    assert outcomes.verification(["a"]) == {"passed": ["a"], "failed": [], "not run": []}
    assert not needs_build(workspace, a) and not needs_verify(workspace, a)
    assert (a.directory / "made.txt").read_text() == "a"



def test_a_worker_is_foreseen_for_what_is_neither_built_nor_stored_nor_verified(tmp_path: Path) -> None:
    """What a build or verify command starts its fork server early for (``cli/common.py``):
    a worker will run. Restorable from the store, or verified already: none will."""
    workspace = open_workspace(tmp_path, CHAIN)
    chain = workspace.order([workspace.artifact("c")])
    assert [artifact.name for artifact in chain] == ["a", "b", "c"]
    # Nothing built or stored: a's build needs one.
    assert needs_a_worker(workspace, chain, verifying=False)
    run_here(workspace, ["c"], verify_them=False)
    assert not needs_a_worker(workspace, chain, verifying=False)
    assert needs_a_worker(workspace, chain, verifying=True)
    run_here(workspace, ["c"], verify_them=True)
    assert not needs_a_worker(workspace, chain, verifying=True)
    # Gone from build/, kept in the store with its report: restored in this process, no
    # worker. c's fingerprint follows from b's bytes: known once b is restored, not counted.
    shutil.rmtree(workspace.artifact("b").directory)
    assert not needs_a_worker(workspace, chain, verifying=True)
    # A new parameter: a build nobody has made.
    changed = open_workspace(tmp_path, CHAIN.replace("writes: a}", "writes: a2}"))
    assert needs_a_worker(changed, changed.order([changed.artifact("c")]), verifying=False)

def test_a_build_alone_verifies_nothing(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, "a: {kind: scheduler_rules_step, writes: a}\n")
    outcomes, calls = run_here(workspace, ["a"], verify_them=False)
    assert calls == [("build", "a")]
    assert (outcomes.succeeded, outcomes.failed) == ({"a"}, {})
    assert outcomes.verification(["a"]) == {"passed": [], "failed": [], "not run": ["a"]}
    assert verification_state(workspace, workspace.artifact("a")) is VerificationState.NOT_VERIFIED


def test_an_artifact_built_at_its_fingerprint_is_only_verified(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, "a: {kind: scheduler_rules_step, writes: a}\n")
    run_here(workspace, ["a"], verify_them=False)
    a = workspace.artifact("a")
    assert not needs_build(workspace, a) and needs_verify(workspace, a)
    outcomes, calls = run_here(workspace, ["a"], verify_them=True)
    assert calls == [("verify", "a")]
    # Up to date counts as a success of its task, as doit's "-- a" does.
    assert (outcomes.succeeded, outcomes.failed) == ({"a", "verify:a"}, {})


def test_an_artifact_verified_and_kept_runs_no_step(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, CHAIN)
    run_here(workspace, ["c"], verify_them=True)
    outcomes, calls = run_here(workspace, ["c"], verify_them=True)
    assert calls == []
    assert outcomes.succeeded == {"a", "b", "c", "verify:a", "verify:b", "verify:c"}
    assert outcomes.verification(["c"]) == {"passed": ["c"], "failed": [], "not run": []}


def test_a_verified_build_missing_from_the_store_is_kept_again(tmp_path: Path) -> None:
    """Verified here, but its store entry (and report) gone, as after a run killed between
    the two: it needs verifying -- the step keeps it -- and no build."""
    import shutil

    workspace = open_workspace(tmp_path, "a: {kind: scheduler_rules_step, writes: a}\n")
    run_here(workspace, ["a"], verify_them=True)
    a = workspace.artifact("a")
    shutil.rmtree(workspace.layout.root / "cache" / "store")
    assert verification_state(workspace, a) is VerificationState.VERIFIED
    assert not needs_build(workspace, a) and needs_verify(workspace, a)
    outcomes, calls = run_here(workspace, ["a"], verify_them=True)
    assert calls == [("verify", "a")]
    assert workspace.store.has_report(a.fingerprint, a.verify_fingerprint) and not needs_verify(workspace, a)


def test_a_damaged_output_needs_building_again(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, CHAIN)
    run_here(workspace, ["c"], verify_them=True)
    (workspace.artifact("b").directory / "made.txt").write_text("b + something else")
    assert [name for name in "abc" if needs_build(workspace, workspace.artifact(name))] == ["b"]
    outcomes, calls = run_here(workspace, ["c"], verify_them=False)
    # Restored from the store by the build step; c, keyed by b's bytes, was never stale.
    assert calls == [("build", "b")]
    assert (workspace.artifact("b").directory / "made.txt").read_text() == "b + a"
    assert outcomes.failed == {}


def test_a_chain_is_built_then_verified_sources_first(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, CHAIN)
    outcomes, calls = run_here(workspace, ["c"], verify_them=True)
    assert calls == [("build", "a"), ("build", "b"), ("build", "c"), ("verify", "a"), ("verify", "b"), ("verify", "c")]
    assert (workspace.artifact("c").directory / "made.txt").read_text() == "c + b + a"
    # Only those asked for are summed up; their sources were verified first (the chain rule).
    assert outcomes.verification(["c"]) == {"passed": ["c"], "failed": [], "not run": []}
    assert outcomes.succeeded == {"a", "b", "c", "verify:a", "verify:b", "verify:c"}


def test_a_failed_build_blocks_everything_made_from_it(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, failing(CHAIN, "a", "build"))
    outcomes, calls = run_here(workspace, ["c"], verify_them=True)
    assert calls == [("build", "a")]
    # In task order: the failure with its error, then every task that waited for it, not run.
    assert outcomes.failed == {"a": "a: its parameters say the build fails", "b": None, "c": None,
                               "verify:a": None, "verify:b": None, "verify:c": None}
    assert outcomes.errors() == {"a": "a: its parameters say the build fails"}
    assert outcomes.not_run_because == {}
    assert outcomes.verification(["a", "b", "c"]) == {"passed": [], "failed": ["a"], "not run": ["b", "c"]}
    assert not any(workspace.artifact(name).directory.exists() for name in "abc")


def test_a_failed_verification_blocks_the_verifications_made_from_it_by_name(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, failing(CHAIN, "a", "verify"))
    outcomes, calls = run_here(workspace, ["c"], verify_them=True)
    # Everything is built (a build does not wait for a verification); only a is judged.
    assert calls == [("build", "a"), ("build", "b"), ("build", "c"), ("verify", "a")]
    assert outcomes.succeeded == {"a", "b", "c"}
    assert list(outcomes.failed) == ["verify:a", "verify:b", "verify:c"]
    assert outcomes.failed["verify:a"].startswith("a: verification failed: told_to_pass")
    assert outcomes.not_run_because == {
        "verify:b": "b: not run: its source a did not pass verification",
        # c names the source it waited for, which was itself held back by a.
        "verify:c": "c: not run: its source b did not pass verification",
    }
    assert outcomes.verification(["a", "b", "c"]) == {"passed": [], "failed": ["a"], "not run": ["b", "c"]}
    # Neither would count if judged: the chain rule, as the state says too.
    assert verification_state(workspace, workspace.artifact("a")) is VerificationState.FAILED
    assert verification_state(workspace, workspace.artifact("b")) is VerificationState.NOT_VERIFIED


DIAMOND = """\
a: {kind: scheduler_rules_step, writes: a}
b: {kind: scheduler_rules_step, writes: b, sources: [a]}
c: {kind: scheduler_rules_step, writes: c, sources: [a]}
d: {kind: scheduler_rules_step, writes: d, sources: [b, c]}
"""


def test_a_diamond_is_done_in_dependency_order(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, DIAMOND)
    outcomes, calls = run_here(workspace, ["d"], verify_them=True)
    assert calls == [("build", "a"), ("build", "b"), ("build", "c"), ("build", "d"),
                     ("verify", "a"), ("verify", "b"), ("verify", "c"), ("verify", "d")]
    assert (workspace.artifact("d").directory / "made.txt").read_text() == "d + b + a + c + a"
    assert outcomes.verification(["d"]) == {"passed": ["d"], "failed": [], "not run": []}


def test_a_failed_verification_in_a_diamond_blocks_only_what_is_made_from_it(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, failing(DIAMOND, "b", "verify"))
    outcomes, calls = run_here(workspace, ["d"], verify_them=True)
    # c, beside b, is still verified: a failure skips only what depends on it.
    assert calls[4:] == [("verify", "a"), ("verify", "b"), ("verify", "c")]
    assert outcomes.not_run_because == {"verify:d": "d: not run: its source b did not pass verification"}
    assert outcomes.verification(["a", "b", "c", "d"]) == {"passed": ["a", "c"], "failed": ["b"], "not run": ["d"]}


def test_a_failed_build_in_a_diamond_blocks_only_what_is_made_from_it(tmp_path: Path) -> None:
    workspace = open_workspace(tmp_path, failing(DIAMOND, "c", "build"))
    outcomes, calls = run_here(workspace, ["d"], verify_them=True)
    assert calls == [("build", "a"), ("build", "b"), ("build", "c"), ("verify", "a"), ("verify", "b")]
    assert list(outcomes.failed) == ["c", "d", "verify:c", "verify:d"]
    assert outcomes.errors() == {"c": "c: its parameters say the build fails"}
    assert outcomes.verification(["a", "b", "c", "d"]) == {"passed": ["a", "b"], "failed": ["c"], "not run": ["d"]}


def test_fail_fast_stops_at_the_first_failure(tmp_path: Path) -> None:
    artifacts = "a: {kind: scheduler_rules_step, writes: a, fails: build}\nx: {kind: scheduler_rules_step, writes: x}\n"
    workspace = open_workspace(tmp_path, artifacts)
    outcomes, calls = run_here(workspace, ["a", "x"], verify_them=True)
    assert calls == [("build", "a"), ("build", "x"), ("verify", "x")]
    assert outcomes.verification(["a", "x"]) == {"passed": ["x"], "failed": ["a"], "not run": []}

    (tmp_path / "fail_fast").mkdir()
    workspace = open_workspace(tmp_path / "fail_fast", artifacts)
    outcomes, calls = run_here(workspace, ["a", "x"], verify_them=True, fail_fast=True)
    # x depends on nothing that failed: it is not run only because the run stopped.
    assert calls == [("build", "a")]
    assert outcomes.failed == {"a": "a: its parameters say the build fails", "x": None, "verify:a": None, "verify:x": None}
    assert outcomes.verification(["a", "x"]) == {"passed": [], "failed": ["a"], "not run": ["x"]}


# --- the cluster driver's bookkeeping -------------------------------------------------------


class EngineHere(Executor):
    """A cluster engine with one worker, this process, that runs nothing: a job fails
    when its artifact's parameters say it does, and one whose source failed ends as not
    run, as Dask's engine reports them (``edgebuild/run/executors/dask.py``). What the
    driver makes of that is under test, not a cluster."""

    label = "here"

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace
        self.ran: list[str] = []

    def offers(self) -> list[WorkerOffer]:
        return [WorkerOffer("here", "here", {"MEMORY": 1e15}, 1)]

    def run(self, jobs: list[Job], say) -> dict[str, Outcome]:
        ended: dict[str, Outcome] = {}
        for job in jobs:
            failed = [source for source in job.sources if not ended[source].ok]
            if failed:
                ended[job.name] = Outcome(job.name, False, f"{job.name}: not run: its source {failed[0]} failed", ran=False)
                continue
            self.ran.append(job.name)
            fails = self.workspace.artifact(job.name).params.fails
            ended[job.name] = Outcome(job.name, fails is None, f"{job.name}: {fails or 'built and verified'}", "here")
        return ended


def test_the_cluster_driver_keeps_what_failed_and_what_was_not_run_as_the_scheduler_does(tmp_path: Path) -> None:
    from edgebuild.run.executors import run_on_cluster

    (tmp_path / "artifacts.yaml").write_text("artifacts:\n" + textwrap.indent(failing(CHAIN, "b", "build") + (
        "d: {kind: scheduler_rules_step, writes: d}\n"), "  "))
    (tmp_path / "remote").mkdir()
    workspace = Workspace.open(tmp_path / "artifacts.yaml", tmp_path,
                               Settings.from_environ().replace(remote_cache=str(tmp_path / "remote")))
    said: list[str] = []
    engines: list[EngineHere] = []

    def open_here(address: str, settings: Settings) -> EngineHere:
        engines.append(EngineHere(workspace))
        return engines[0]

    outcomes = run_on_cluster(workspace, [workspace.artifact("c"), workspace.artifact("d")], "here", said.append,
                              open_engine=open_here)
    assert engines[0].ran == ["a", "b", "d"]
    assert outcomes.succeeded == {"a", "verify:a", "d", "verify:d"}
    assert outcomes.errors() == {"b": "b: build"}
    assert outcomes.not_run_because == {"c": "c: not run: its source b failed", "verify:c": "c: not run: its source b failed"}
    assert outcomes.verification(["a", "b", "c", "d"]) == {"passed": ["a", "d"], "failed": ["b"], "not run": ["c"]}
    assert "edgebuild: error: b: build" in said
    assert "  [c] not run: its source b failed" in said
    assert said[-1] == "cluster: 2 of 4 built and verified; failed or not run: b, c"
    # What the local run is left to pull: a and d (b's failure is counted, c's not-run too).
    merged = Outcomes().merged(outcomes)
    assert merged.verification(["c", "d"]) == {"passed": ["d"], "failed": [], "not run": ["c"]}


def test_statuses_from_one_listing_say_what_each_artifact_s_own_look_up_says(tmp_path: Path) -> None:
    """`doit status` lists build/ and the store's entry directories once, and answers an
    artifact neither shows without looking it up: each state is the one ``status`` gives
    alone. Verified, built only, restorable from the store, refused, never built, and a
    leftover directory in build/ whose name differs from an artifact's in case only."""
    from edgebuild.run.state import status, statuses

    workspace = open_workspace(tmp_path, """\
        verified: {kind: scheduler_rules_step, writes: v}
        built: {kind: scheduler_rules_step, writes: b}
        stored: {kind: scheduler_rules_step, writes: s}
        refused: {kind: scheduler_rules_step, writes: r}
        never: {kind: scheduler_rules_step, writes: n}
        """)
    run_here(workspace, ["verified"], verify_them=True)
    run_here(workspace, ["built", "stored"], verify_them=False)
    stored = workspace.artifact("stored")
    shutil.rmtree(stored.directory)
    workspace.store.remember_rejection(workspace.artifact("refused").fingerprint, "the target's compiler said no")
    (workspace.layout.build_dir / "NEVER").mkdir()
    names = ["verified", "built", "stored", "refused", "never"]

    listed = statuses(workspace, [workspace.artifact(name) for name in names])
    alone = [status(workspace, workspace.artifact(name)) for name in names]
    assert listed == alone
    assert [(state.state, state.note) for state in listed] == [
        ("up to date", "verified"),
        ("up to date", "not verified"),
        ("missing", "restorable from the store"),
        ("missing", listed[3].note),
        ("missing", None),
    ]
    assert listed[3].note.startswith("REFUSED at this fingerprint on ")
    # build/ not a directory: each artifact looks for itself, and nothing is built.
    shutil.rmtree(workspace.layout.build_dir)
    workspace.layout.build_dir.write_text("not a directory\n")
    assert [state.state for state in statuses(workspace, [workspace.artifact(name) for name in names])] == ["missing"] * 5
