"""The Dask engine: ``--dask tcp://HOST:8786`` (a running scheduler) or ``--dask local``
(``local:N``: a LocalCluster of N worker processes on this machine, loopback only).

Each job is one Dask task with the job's resources (``MEMORY``, ``GPU``) as Dask
resources, and its sources' tasks as dependencies. A task reports what it does as
events on one topic, which the driver prints with the worker's address, so the
progress shows which artifact runs where. A worker lost while it ran a task (the
machine gone, the process killed) is said by name, and the scheduler runs the task
again on another worker (up to ``distributed.scheduler.allowed-failures`` times); a
build restarts from nothing there, and the same fingerprint gives the same bytes.
A job fails, without retry, on an edgebuild error (it would fail the same way again).

The scheduler never hangs on a job nobody can take: resources are checked before
anything is submitted, and while jobs wait the driver checks that some worker
still offers what they need (after the one that did was lost, it waits
the ``cluster_wait_seconds`` setting (``EDGEBUILD_CLUSTER_WAIT``) for one to join, then fails them by name).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from edgebuild.errors import ClusterError, EdgebuildError
from edgebuild.core.config import Settings
from edgebuild.run.executors.base import Executor, Job, Outcome, Say, WorkerOffer, run_job

PROGRESS_TOPIC = "edgebuild-progress"
LOCAL = "local"
CONNECT_TIMEOUT_SECONDS = 15
POLL_SECONDS = 0.5
CLOSE_TIMEOUT_SECONDS = 5


class DaskExecutor(Executor):
    def __init__(self, address: str, settings: Settings | None = None) -> None:
        settings = settings or Settings.from_environ()
        self.wait_seconds = settings.cluster_wait_seconds
        try:
            import distributed
        except ImportError:
            raise ClusterError(
                "--dask needs dask's distributed scheduler, which is not installed: pip install -e '.[dask]'"
            ) from None
        if not settings.verbose:
            _quiet_distributed()
        self._cluster = None
        # (artifact, worker) pairs already said to be lost.
        self._lost: set[tuple[str, str]] = set()
        self._lost_scheduler = False
        if local_worker_count(address) is not None:
            self._cluster = _local_cluster(address)
            target: Any = self._cluster
            self.label = f"{address} ({self._cluster.scheduler_address})"
        else:
            target = address
            self.label = address
        try:
            self.client = distributed.Client(target, timeout=CONNECT_TIMEOUT_SECONDS)
        except (OSError, TimeoutError, ValueError) as error:
            self.close()
            raise ClusterError(
                f"--dask {address}: cannot reach a Dask scheduler there within {CONNECT_TIMEOUT_SECONDS} s ({error}); "
                "start one with `dask scheduler`, or use --dask local"
            ) from None

    def offers(self) -> list[WorkerOffer]:
        waited = time.monotonic() + self.wait_seconds
        offers = self._offers()
        while not offers and time.monotonic() < waited:
            time.sleep(POLL_SECONDS)
            offers = self._offers()
        if not offers:
            raise ClusterError(f"--dask {self.label}: no worker joined the scheduler within {self.wait_seconds:g} s")
        return offers

    def _offers(self) -> list[WorkerOffer]:
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        return [
            WorkerOffer(address, str(info.get("name", address)), dict(info.get("resources") or {}), int(info.get("nthreads", 1)))
            for address, info in sorted(workers.items())
        ]

    def run(self, jobs: list[Job], say: Say) -> dict[str, Outcome]:
        from distributed import wait

        running: dict[str, str] = {}  # artifact -> worker address it last started on
        self.client.subscribe_topic(PROGRESS_TOPIC, lambda event: self._progress(event[1], running, say))
        futures = {}
        for job in jobs:
            futures[job.name] = self.client.submit(
                _run_on_dask_worker,
                job,
                *[futures[source] for source in job.sources],
                key=f"{job.name}-{(job.fingerprint or 'from-sources')[:12]}-{uuid.uuid4().hex[:8]}",
                resources=job.resources,
                pure=False,
                retries=0,
            )
        by_future = {future.key: name for name, future in futures.items()}
        outcomes: dict[str, Outcome] = {}
        pending = set(futures.values())
        unplaceable_since: dict[str, float] = {}
        try:
            while pending:
                if self.client.status not in ("running", "connecting", "newly-created"):
                    raise _SchedulerLost(f"the client is {self.client.status}")
                try:
                    done, pending = wait(pending, timeout=POLL_SECONDS, return_when="FIRST_COMPLETED")
                except TimeoutError:
                    done = set()
                # Dependencies first, so that a dependent's outcome can name its failed source.
                for name in [job.name for job in jobs if futures[job.name] in done]:
                    outcomes[name] = self._outcome(next(job for job in jobs if job.name == name), futures[name], outcomes, running)
                    running.pop(name, None)
                if pending:
                    self._watch(jobs, futures, by_future, pending, running, unplaceable_since, outcomes, say)
                    pending = {future for future in pending if by_future[future.key] not in outcomes}
        except KeyboardInterrupt:
            self.client.cancel(list(futures.values()))
            raise
        except EdgebuildError:
            raise
        except Exception as error:
            # Whatever distributed raises once the scheduler is gone (FuturesCancelledError
            # "scheduler-connection-lost", CommClosedError, ...): the run is over. What
            # finished is in the remote cache; the rest is named, in one line.
            lost = [job.name for job in jobs if job.name not in outcomes or not outcomes[job.name].ok]
            self._lost_scheduler = True
            raise ClusterError(
                f"--dask {self.label}: lost the connection to the scheduler ({_first_line(error)}); not built: "
                f"{', '.join(lost)} (nothing of it counts as built; run the command again)"
            ) from None
        return outcomes

    def _progress(self, message: Any, running: dict[str, str], say: Say) -> None:
        if not isinstance(message, dict):
            return
        name, worker, line = message.get("artifact"), message.get("worker"), message.get("line")
        if message.get("started"):
            before = running.get(name)
            if before is not None and before != worker and (name, before) not in self._lost:
                # A running task starts again only after its worker died (the scheduler
                # moves waiting tasks, never running ones).
                self._lost.add((name, before))
                say(f"  [{name}] worker {before} was lost while it ran; the scheduler runs it again on {worker} "
                    "(from nothing: the same fingerprint gives the same bytes)")
            running[name] = worker
        text = str(line)
        if text.startswith(f"[{name}] "):
            text = text[len(name) + 3:]
        say(f"  [{name} @ {worker}] {text}")

    def _outcome(self, job: Job, future: Any, outcomes: dict[str, Outcome], running: dict[str, str]) -> Outcome:
        from distributed.scheduler import KilledWorker

        worker = running.get(job.name)
        if future.status == "finished":
            return Outcome(job.name, True, f"{job.name}: built and verified", worker)
        failed_sources = [source for source in job.sources if source in outcomes and not outcomes[source].ok]
        if failed_sources:
            return Outcome(job.name, False, f"{job.name}: not run: its source {failed_sources[0]} failed", worker, ran=False)
        if future.status == "cancelled":
            return Outcome(job.name, False, f"{job.name}: cancelled before it finished; nothing of it counts as built", worker)
        error = future.exception()
        if isinstance(error, KilledWorker):
            return Outcome(
                job.name, False,
                f"{job.name}: every Dask worker that ran it was lost (the scheduler's allowed-failures ran out; last "
                f"on {worker or 'an unknown worker'}); nothing of it counts as built",
                worker,
            )
        if isinstance(error, EdgebuildError):
            message = str(error)
            return Outcome(job.name, False, message if message.startswith(f"{job.name}:") else f"{job.name}: {message}", worker)
        return Outcome(job.name, False, f"{job.name}: failed on {worker or 'a worker'}: {type(error).__name__}: {error}", worker)

    def _watch(
        self,
        jobs: list[Job],
        futures: dict[str, Any],
        by_future: dict[str, str],
        pending: set[Any],
        running: dict[str, str],
        unplaceable_since: dict[str, float],
        outcomes: dict[str, Outcome],
        say: Say,
    ) -> None:
        """Say which running artifact lost its worker; fail the jobs that wait for
        resources no worker offers any more, after a grace period."""
        offers = self._offers()
        present = {offer.address for offer in offers}
        for name, worker in list(running.items()):
            if worker not in present and name not in outcomes and (name, worker) not in self._lost:
                self._lost.add((name, worker))
                say(
                    f"  [{name}] worker {worker} was lost while it ran; the scheduler runs it again on another worker "
                    "if it may (from nothing: the same fingerprint gives the same bytes)"
                )
        now = time.monotonic()
        waiting = [job for job in jobs if futures[job.name] in pending and running.get(job.name) not in present]
        for job in waiting:
            if any(all(offer.resources.get(key, 0.0) >= amount for key, amount in job.resources.items()) for offer in offers):
                unplaceable_since.pop(job.name, None)
                continue
            since = unplaceable_since.setdefault(job.name, now)
            if now - since >= self.wait_seconds:
                self.client.cancel([futures[job.name]])
                outcomes[job.name] = Outcome(
                    job.name, False,
                    f"{job.name}: no worker left offers what it needs ({', '.join(f'{k}={v:.3g}' for k, v in sorted(job.resources.items()))}) "
                    f"after {self.wait_seconds:g} s (the worker that did was lost); nothing of it counts as built",
                )
        # Jobs behind one failed here never start: say so, rather than wait on them.
        for job in jobs:
            failed = [source for source in job.sources if source in outcomes and not outcomes[source].ok]
            if failed and job.name not in outcomes and futures[job.name] in pending:
                self.client.cancel([futures[job.name]])
                outcomes[job.name] = Outcome(job.name, False, f"{job.name}: not run: its source {failed[0]} failed", ran=False)

    def close(self) -> None:
        client = getattr(self, "client", None)
        if client is not None:
            try:
                # After a lost scheduler, closing only waits for it: a short wait.
                client.close(timeout=CLOSE_TIMEOUT_SECONDS if self._lost_scheduler else None)
            except Exception:  # noqa: BLE001 - a client of a dead scheduler fails to close in many ways
                pass
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


# Dask's network transports a scheduler listens on (``inproc://`` is one process's only).
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
MAX_LOCAL_WORKERS = 256
_LOCAL_RE = re.compile(r"local(?::([0-9]{1,6}))?")
# scheme://host:port: a DNS name, dotted IPv4, or a bracketed IPv6 address; a port of
# ASCII digits. Dask itself takes a bare host:port as tcp.
_ADDRESS_RE = re.compile(
    r"(?:(?P<scheme>[a-z][a-z0-9+.-]*)://)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?"
)
EXPECTED = ("expected 'local', 'local:N' (N worker processes) or a scheduler's address "
            "such as tcp://host:8786 (tcp, tls, ws, wss or ucx)")


def _quiet_distributed() -> None:
    """distributed logs a lost scheduler (and each attempt to reconnect) as tracebacks on
    the driver's terminal; the driver says it in one line instead. Its loggers have levels
    of their own (set from dask's config at import), so each is set, not just the parent."""
    names = [name for name in logging.root.manager.loggerDict if name == "distributed" or name.startswith("distributed.")]
    for name in ["distributed", *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


class _SchedulerLost(Exception):
    """The client stopped being connected (the scheduler died, or the network went)."""


def _first_line(error: BaseException) -> str:
    """An exception of distributed's in a few words: why its futures were cancelled
    (``scheduler-connection-lost``), else the first line of its message."""
    reasons = sorted({str(group.reason) for group in getattr(error, "error_groups", ()) if getattr(group, "reason", None)})
    if reasons:
        return ", ".join(reasons)
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def local_worker_count(address: str) -> int | None:
    """How many workers ``local`` / ``local:N`` asks for; ``None`` for a scheduler's
    address. Anything else -- ``local:``, ``local: 2``, ``udp://...``, ``tcp://[::1``,
    ``file:///etc/passwd`` -- is a :class:`ClusterError`, whether or not anything
    needs the cluster."""
    if address == LOCAL or address.startswith(LOCAL + ":"):
        match = _LOCAL_RE.fullmatch(address)
        if match is None:
            raise ClusterError(f"--dask {address!r}: {EXPECTED}")
        if match.group(1) is None:
            return min(os.cpu_count() or 1, 4)
        count = int(match.group(1))
        if not 1 <= count <= MAX_LOCAL_WORKERS:
            raise ClusterError(f"--dask {address}: expected 1 to {MAX_LOCAL_WORKERS} local workers, found {count}")
        return count
    match = _ADDRESS_RE.fullmatch(address)
    if match is None:
        raise ClusterError(f"--dask {address!r}: {EXPECTED}")
    scheme, port = match.group("scheme"), match.group("port")
    if scheme is not None and scheme not in SCHEMES:
        raise ClusterError(f"--dask {address}: {scheme}:// is not a Dask transport; {EXPECTED}")
    if port is not None and not 1 <= int(port) <= 65535:
        raise ClusterError(f"--dask {address}: port {port} is not 1 to 65535; {EXPECTED}")
    return None


def _local_cluster(address: str) -> Any:
    """A LocalCluster on loopback: N worker processes of one thread each (one build at a
    time per worker), each offering 1/N of this machine's memory."""
    import psutil
    from distributed import LocalCluster

    count = local_worker_count(address)
    memory = psutil.virtual_memory().total // count
    return LocalCluster(
        n_workers=count,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        # Diagnostics on loopback too, at a free port: a fixed one (8787) collides with
        # another cluster on the machine.
        dashboard_address="127.0.0.1:0",
        worker_dashboard_address="127.0.0.1:0",
        silence_logs=logging.ERROR,
        resources={"MEMORY": float(memory)},
        # The workers' builds share this machine's cores: each takes cores / N torch threads.
        # Their stderr is this terminal: a job's output reaches it once, through the driver.
        env=Settings(jobs=count, job_output_to_worker_log=False).environ({}),
    )


def _run_on_dask_worker(job: Job, *sources_done: Any) -> dict[str, Any]:
    """The task: runs on a Dask worker once every source's task has succeeded."""
    from distributed import get_worker

    worker = get_worker()

    def emit(line: str, started: bool = False) -> None:
        worker.log_event(PROGRESS_TOPIC, {"artifact": job.name, "worker": worker.address, "line": line, "started": started})

    emit(f"started (needs {', '.join(f'{k}={v:.3g}' for k, v in sorted(job.resources.items()))})", started=True)
    threads = getattr(worker.state, "nthreads", None) or 1
    result = run_job(job, Path(worker.local_directory), threads, emit)
    emit(f"built, verified and pushed in {result['seconds']:.1f} s")
    return result | {"worker": worker.address}
