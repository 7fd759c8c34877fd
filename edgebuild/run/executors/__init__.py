"""Running artifacts on a cluster: ``doit build --dask ADDRESS``, ``doit verify --dask ADDRESS``.

The driver lives here, what a job does on a worker in ``base.py``, both
engine-independent; an engine is an :class:`~edgebuild.run.executors.base.Executor`
(Dask's is ``dask.py``), so another one (Ray, a batch queue) is one more module
and one line in :func:`open_executor`.

- The driver (the doit process): fingerprints the selection. What the remote cache
  already holds needs no task. Each other artifact becomes a :class:`Job` with the
  resources it needs (``resources.py``) and the jobs of its sources as dependencies,
  so the cluster runs them in order, wherever it likes. Then the local doit run
  pulls every artifact with ``--pull-only``: nothing is exported here, and only
  what a worker verified and pushed is ever counted as built.
- A cluster worker (:func:`~edgebuild.executors.base.run_job`): works in a project root of its own under its
  local directory -- the manifest and the inputs it names are read where the
  driver has them (a shared filesystem, or the same checkout path on every node);
  outputs, store and stat cache are the worker's. It builds in one worker process
  (``edgebuild/workers.py``), pulling the sources from the remote cache, then
  verifies in another, which pushes. The remote cache takes only verified builds,
  so ``doit build --dask`` verifies on the worker too: it is the only way a build
  can travel.

A remote cache that every worker can reach is therefore required; its absence (or
a read-only one) stops the command before anything is submitted. A worker that
computes another fingerprint than the driver (another checkout, other tool
versions) pushes nothing and fails its job: the driver could never pull it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from edgebuild.errors import ClusterError
from edgebuild.run.executors.base import Executor, Job, Say, WorkerOffer

if TYPE_CHECKING:
    from edgebuild.core.config import Settings
    from edgebuild.core.project import Artifact
    from edgebuild.run.scheduler import Outcomes
    from edgebuild.run.workspace import Workspace


def check_address(address: str) -> None:
    """Refuse a malformed address before anything else, even when nothing needs the cluster."""
    from edgebuild.run.executors.dask import local_worker_count

    local_worker_count(address)


def open_executor(address: str, settings: "Settings") -> Executor:
    from edgebuild.run.executors.dask import DaskExecutor

    return DaskExecutor(address, settings)


# --- the driver --------------------------------------------------------------------------


def run_on_cluster(workspace: "Workspace", artifacts: "list[Artifact]", address: str, say: Say,
                   open_engine: "Callable[[str, Settings], Executor]" = open_executor) -> "Outcomes":
    """Build and verify ``artifacts`` and what they consume on the cluster at ``address``
    (``open_engine`` opens it: Dask's by default); everything that succeeded is in the
    remote cache when this returns. What happened is kept as the scheduler keeps it
    (``edgebuild/run/scheduler.py``): an artifact whose job failed failed (its build task),
    one behind it, on the cluster or here, was not run (both its tasks, with the reason);
    the rest are for the local run to pull."""
    from edgebuild.core.project import SourceNotBuilt
    from edgebuild.run import scheduler
    from edgebuild.run.costs import recorded_costs
    from edgebuild.run.executors.resources import task_resources
    from edgebuild.run.state import VerificationState, verification_state

    check_address(address)
    remote = workspace.remote
    if remote is None:
        raise ClusterError(
            "--dask: cluster workers hand their builds back through the remote cache, and none is set: set "
            "EDGEBUILD_REMOTE_CACHE (or the manifest's remote_cache) to a location every worker can reach "
            "(a shared directory, s3://bucket/prefix)"
        )
    if remote.readonly:
        raise ClusterError(
            f"--dask: the remote cache {remote.label} is read-only (EDGEBUILD_REMOTE_CACHE_READONLY or "
            "--remote-readonly), so no worker could hand a build back; run without --dask, or with a writable cache"
        )
    remote.location.check_root()
    selection = workspace.order(artifacts)
    costs = recorded_costs(workspace, [artifact.name for artifact in selection])
    jobs: list[Job] = []
    for artifact in selection:
        job_names = {job.name for job in jobs}
        try:
            fingerprint: str | None = artifact.fingerprint
        except SourceNotBuilt:
            # Keyed by its source's bytes, which a job of this run will make: known then.
            fingerprint = None
        if fingerprint is not None:
            if remote.has(fingerprint):
                say(f"[{artifact.name}] in the remote cache already: pulled, not run on the cluster")
                continue
            if verification_state(workspace, artifact) is VerificationState.VERIFIED:
                # Verified here before the remote was set: the verify step shares it (it
                # pushes, judging nothing again), and no cluster time is spent.
                scheduler.verify(workspace, artifact)
                continue
        resources, basis = task_resources(artifact, costs.get(artifact.name))
        jobs.append(
            Job(
                name=artifact.name,
                fingerprint=fingerprint,
                sources=tuple(source.name for source in artifact.sources if source.name in job_names),
                resources=resources,
                resource_basis=basis,
                manifest_path=str(workspace.manifest.path.resolve()),
                remote_cache=remote.location.url,
                worker_imports=artifact.kind.process.worker_imports,
                build_imports=artifact.kind.process.build_imports,
                build_warmups=artifact.kind.process.build_warmups,
            )
        )
    workspace.save_caches()
    outcomes = scheduler.Outcomes()
    if not jobs:
        return outcomes
    with open_engine(address, workspace.settings) as executor:
        say(f"cluster {executor.label}: {len(jobs)} artifacts to build and verify ({', '.join(job.name for job in jobs)})")
        _check_resources(jobs, executor.offers())
        ended = executor.run(jobs, say)
    for job in jobs:
        outcome = ended[job.name]
        if outcome.ok:
            # A job builds and verifies: the remote cache takes only verified builds.
            outcomes.success(job.name)
            outcomes.success(f"verify:{job.name}")
        elif outcome.ran:
            say(f"edgebuild: error: {outcome.message}")
            outcomes.failure(job.name, outcome.message)
        else:
            _not_run(outcomes, job.name, outcome.message)
    # What is made from a failed artifact is not run, whether or not it was a job of its own
    # (one in the remote cache already would be pulled as if its source had been built).
    for artifact in selection:
        held_back = next((source.name for source in artifact.sources if source.name in outcomes.failed), None)
        if held_back is not None and artifact.name not in outcomes.failed:
            _not_run(outcomes, artifact.name, f"{artifact.name}: not run: its source {held_back} failed")
    for name, reason in outcomes.not_run_because.items():
        if not name.startswith("verify:"):
            say(f"  [{name}] {reason.removeprefix(f'{name}: ')}")
    done = sum(1 for job in jobs if ended[job.name].ok)
    missed = [job.name for job in jobs if not ended[job.name].ok]
    say(f"cluster: {done} of {len(jobs)} built and verified" + (f"; failed or not run: {', '.join(missed)}" if missed else ""))
    return outcomes


def _not_run(outcomes: "Outcomes", name: str, reason: str) -> None:
    outcomes.not_run(name, reason)
    outcomes.not_run(f"verify:{name}", reason)


def _check_resources(jobs: list[Job], offers: list[WorkerOffer]) -> None:
    """Refuse, before anything is submitted, a job no worker can take: the scheduler would
    keep it waiting for ever."""
    from edgebuild.run.executors.resources import describe

    for job in jobs:
        if any(_fits(job.resources, offer.resources) for offer in offers):
            continue
        largest = {
            key: max((offer.resources.get(key, 0.0) for offer in offers), default=0.0) for key in job.resources
        }
        short = ", ".join(
            f"{key}={needed:.3g} needed, at most {largest[key]:.3g} offered" for key, needed in sorted(job.resources.items())
            if largest[key] < needed
        ) or "no single worker offers all of them"
        unfit = sum(1 for other in jobs if not any(_fits(other.resources, offer.resources) for offer in offers))
        more = f" (and {unfit - 1} more artifacts)" if unfit > 1 else ""
        raise ClusterError(
            f"{job.name}: no worker of the cluster offers the resources it needs ({describe(job.resources)}; MEMORY "
            f"{job.resource_basis}): {short}{more}; start a worker with --resources \"{describe(job.resources).replace(', ', ',')}\" "
            "(or more); nothing was submitted"
        )


def _fits(needs: dict[str, float], offer: dict[str, float]) -> bool:
    return all(offer.get(key, 0.0) >= amount for key, amount in needs.items())


