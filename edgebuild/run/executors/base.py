"""What every cluster engine shares: a :class:`Job` (one artifact to build and verify on
a worker), what a worker offers, how a job ended, the :class:`Executor` interface an
engine implements, and :func:`run_job`, what a job does on the worker whatever the
engine (see ``edgebuild/executors/__init__.py``).
"""

from __future__ import annotations

import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgebuild.errors import ClusterError, PlanChanged

Say = Callable[[str], None]


@dataclass(frozen=True)
class Job:
    """One artifact to build and verify on a cluster worker. ``fingerprint`` is ``None``
    for one keyed by the bytes of a source that another job of the run builds."""

    name: str
    fingerprint: str | None
    # Jobs this one waits for (its sources that are jobs too; the others are in the remote cache).
    sources: tuple[str, ...]
    resources: dict[str, float]
    resource_basis: str
    manifest_path: str
    remote_cache: str
    # The kind's worker_imports: a cluster worker's fork server imports them once; its
    # build_imports, before it forks the build; its build_warmups, after.
    worker_imports: tuple[str, ...] = ()
    build_imports: tuple[str, ...] = ()
    build_warmups: tuple[str, ...] = ()


@dataclass(frozen=True)
class WorkerOffer:
    """A worker and what it offers."""

    address: str
    name: str
    resources: dict[str, float]
    threads: int


@dataclass
class Outcome:
    name: str
    ok: bool
    message: str
    worker: str | None = None
    # False: never started, because a job it waits for failed (the scheduler's "not run").
    ran: bool = True


class Executor(ABC):
    """One cluster engine."""

    label: str

    @abstractmethod
    def offers(self) -> list[WorkerOffer]:
        """The workers there now."""

    @abstractmethod
    def run(self, jobs: list[Job], say: Say) -> dict[str, Outcome]:
        """Run ``jobs`` (in dependency order: a job's sources come before it), each where
        its resources fit, a job only after its sources succeeded; say what runs where;
        return how each ended. A job whose source failed ends as not run."""

    def close(self) -> None:
        pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- a cluster worker --------------------------------------------------------------------


def run_job(job: Job, local_directory: Path, threads: int, emit: Say) -> dict[str, Any]:
    """Build ``job`` and verify it, each in a worker process; the verification pushes it to
    the remote cache. Raises the edgebuild error that stopped it (one line, naming it).

    The cluster worker's own settings (its environment) apply, but for what the job
    decides: where the remote cache is, that it is written, and that this worker builds."""
    from edgebuild.cache.remote import RemoteCache
    from edgebuild.cache.signing import Trust
    from edgebuild.core.config import Settings
    from edgebuild.core.hashing import digest_bytes
    from edgebuild.run.workers import run_worker_at

    started = time.perf_counter()
    settings = Settings.from_environ().replace(
        remote_cache=job.remote_cache, remote_readonly=False, pull_only=False, manifest=job.manifest_path
    )
    remote = RemoteCache.open(job.remote_cache, s3_endpoint=settings.s3_endpoint, trust=Trust.from_settings(settings))
    if job.fingerprint is not None and remote.settled(job.fingerprint):
        # An earlier attempt (on a worker lost after it pushed) or another driver got there first.
        emit("in the remote cache already: nothing to do")
        return {"seconds": time.perf_counter() - started}
    root = local_directory / "edgebuild" / digest_bytes(job.manifest_path.encode())[:16]
    root.mkdir(parents=True, exist_ok=True)
    # Builds running at once on this worker share its cores (unless the worker says otherwise).
    if not settings.jobs:
        settings = settings.replace(jobs=max(1, threads))
    environment = settings.environ()

    def relay(stream: str, line: str) -> None:
        # All of it in the worker's own log; to the driver, what says what happens (not the
        # report's table, which the driver pulls with the build).
        if settings.job_output_to_worker_log:
            sys.stderr.write(line)
        text = line.strip()
        if text and not text.startswith(("|", "fingerprint `")):
            emit(text)

    try:
        built = run_worker_at("build", job.manifest_path, str(root), job.name, environment, relay, expect=job.fingerprint,
                              imports=job.worker_imports + job.build_imports, warmups=job.build_warmups)
    except PlanChanged:
        if job.fingerprint is not None:
            raise ClusterError(
                f"{job.name}: this worker computes another fingerprint than the driver ({job.fingerprint[:12]}): "
                "it sees other inputs, code or tool versions (another checkout or environment?); nothing was pushed"
            ) from None
        raise
    run_worker_at("verify", job.manifest_path, str(root), job.name, environment, relay, expect=built.get("fingerprint"),
                  imports=job.worker_imports)
    return {"seconds": time.perf_counter() - started}
