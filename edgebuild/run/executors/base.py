"""What every cluster engine shares: a :class:`Job` (one artifact to build and verify on
a worker), what a worker offers, how a job ended, the :class:`Executor` interface an
engine implements, and :func:`run_job`, what a job does on the worker whatever the
engine (see ``edgebuild/executors/__init__.py``).
"""

from __future__ import annotations

import os
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgebuild.errors import ClusterError

Say = Callable[[str], None]
# Environment a job's worker processes must not inherit from the cluster worker: the
# job says where the remote cache is, and it must write to it.
JOB_UNSET_ENV = ("EDGEBUILD_REMOTE_CACHE_READONLY", "EDGEBUILD_PULL_ONLY", "EDGEBUILD_MANIFEST")
# How long the driver waits for a first worker, or for one that offers what a job still
# waiting needs after the one that did was lost (an autoscaler may bring one).
CLUSTER_WAIT_ENV = "EDGEBUILD_CLUSTER_WAIT"
# "0": a job's output goes to the driver only, not also to the cluster worker's own stderr
# (a local cluster's workers share the driver's terminal: every line would show twice).
JOB_OUTPUT_TO_WORKER_LOG_ENV = "EDGEBUILD_JOB_OUTPUT_TO_WORKER_LOG"
DEFAULT_CLUSTER_WAIT_SECONDS = 60.0


def cluster_wait_seconds() -> float:
    try:
        return float(os.environ.get(CLUSTER_WAIT_ENV, "") or DEFAULT_CLUSTER_WAIT_SECONDS)
    except ValueError:
        return DEFAULT_CLUSTER_WAIT_SECONDS


@dataclass(frozen=True)
class Job:
    """One artifact to build and verify on a cluster worker."""

    name: str
    fingerprint: str
    # Jobs this one waits for (its sources that are jobs too; the others are in the remote cache).
    sources: tuple[str, ...]
    resources: dict[str, float]
    resource_basis: str
    manifest_path: str
    remote_cache: str


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
    the remote cache. Raises the edgebuild error that stopped it (one line, naming it)."""
    from edgebuild.core.hashing import digest_bytes
    from edgebuild.cache.remote import RemoteCache
    from edgebuild.run.workers import run_worker_at

    started = time.perf_counter()
    if RemoteCache.open(job.remote_cache).has(job.fingerprint):
        # An earlier attempt (on a worker lost after it pushed) or another driver got there first.
        emit("in the remote cache already: nothing to do")
        return {"seconds": time.perf_counter() - started}
    root = local_directory / "edgebuild" / digest_bytes(job.manifest_path.encode())[:16]
    root.mkdir(parents=True, exist_ok=True)
    environment = {key: value for key, value in os.environ.items() if key not in JOB_UNSET_ENV}
    environment["EDGEBUILD_REMOTE_CACHE"] = job.remote_cache
    # Builds running at once on this worker share its cores (unless the worker says otherwise).
    environment.setdefault("EDGEBUILD_JOBS", str(max(1, threads)))

    to_worker_log = os.environ.get(JOB_OUTPUT_TO_WORKER_LOG_ENV, "1") != "0"

    def relay(stream: str, line: str) -> None:
        # All of it in the worker's own log; to the driver, what says what happens (not the
        # report's table, which the driver pulls with the build).
        if to_worker_log:
            sys.stderr.write(line)
        text = line.strip()
        if text and not text.startswith(("|", "fingerprint `")):
            emit(text)

    built = run_worker_at("build", job.manifest_path, str(root), job.name, environment, relay)
    if built.get("fingerprint") != job.fingerprint:
        raise ClusterError(
            f"{job.name}: this worker computed fingerprint {str(built.get('fingerprint'))[:12]}, the driver "
            f"{job.fingerprint[:12]}: it sees other inputs, code or tool versions (another checkout or environment?); "
            "nothing was pushed"
        )
    run_worker_at("verify", job.manifest_path, str(root), job.name, environment, relay)
    return {"seconds": time.perf_counter() - started}

