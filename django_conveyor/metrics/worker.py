"""`conveyor_worker --metrics-port N`: what a worker process does, served on a port.

`WorkerMetrics` is an `instrument.Instrument`: the worker calls it at each
event and it updates prometheus_client's counters, histograms and gauges.
`serve()` starts prometheus_client's own HTTP server in a daemon thread of
the process, on a registry that holds these metrics and the process's
enqueue counters (`process.py`, for handlers that enqueue).

With `--processes N` every worker process serves its own port, N ports
from `--metrics-port` up (child 0 on the port given, child 1 on the next,
and so on; a restarted child takes its predecessor's port). One port per
process keeps each process's figures its own: no shared files to clean
up, nothing that depends on when prometheus_client is first imported, and
a child that dies takes its gauges with it. Prometheus scrapes each port
as a target; `sum()` adds them up, and `rate()` copes with a restarted
child's counters starting again from zero.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..bounds import MAX_PORT
from ..worker.config import WorkerOptions
from ..worker.instrument import Instrument
from ..worker.loop import Worker
from . import process

if TYPE_CHECKING:
    from ..protocol import Lease

logger = logging.getLogger(__name__)

STALE_REFUSED = "stale-refused"
# Run times and pickup delays reach from milliseconds to hours:
# prometheus_client's default buckets stop at 10 s.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class WorkerMetrics(Instrument):
    """The worker's metrics, on a registry of their own (`self.registry`)."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.processed = Counter(
            "conveyor_jobs_processed",
            "Attempts whose outcome this worker wrote (completed, retried, failed, dead, "
            "snoozed, released, cancelled) or that the fence refused (stale-refused).",
            ("queue", "task", "outcome"),
            registry=registry,
        )
        self.duration = Histogram(
            "conveyor_job_duration_seconds",
            "Handler run time of attempts whose outcome was written.",
            ("queue", "task"),
            buckets=BUCKETS,
            registry=registry,
        )
        self.pickup = Histogram(
            "conveyor_job_pickup_seconds",
            "From when a job was due (enqueued, or its run_after) to its claim.",
            ("queue",),
            buckets=BUCKETS,
            registry=registry,
        )
        self.leases_lost = Counter(
            "conveyor_leases_lost",
            "Leases a heartbeat found taken by another party (reaped, or requeued).",
            ("queue", "task"),
            registry=registry,
        )
        self.in_flight = Gauge(
            "conveyor_worker_jobs_in_flight",
            "Handlers running in this worker process.",
            registry=registry,
        )
        self.held = Gauge(
            "conveyor_worker_leases_held",
            "Leases this worker process holds: running, or claimed ahead and waiting for a slot.",
            registry=registry,
        )

    def claimed(self, leases: Sequence[Lease]) -> None:
        for lease in leases:
            self.pickup.labels(lease.queue).observe(max(lease.pickup_delay, 0.0))

    def outcome_written(self, kind: str, result: str, lease: Lease, duration: float | None) -> None:
        self.processed.labels(lease.queue, lease.task_path, result).inc()
        if duration is not None:
            self.duration.labels(lease.queue, lease.task_path).observe(duration)

    def outcome_refused(self, kind: str, lease: Lease) -> None:
        self.processed.labels(lease.queue, lease.task_path, STALE_REFUSED).inc()

    def lease_lost(self, lease: Lease, reason: str) -> None:
        self.leases_lost.labels(lease.queue, lease.task_path).inc()

    def leases_counted(self, *, held: int, in_flight: int) -> None:
        self.held.set(held)
        self.in_flight.set(in_flight)


class PortTaken(Exception):
    """The metrics port cannot be bound."""


def check_port(address: str, port: int) -> None:
    """Raise PortTaken unless `port` can be bound now (before any child starts)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As prometheus_client's server does, so a port in TIME_WAIT is not "taken".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            raise PortTaken(_taken(address, port, exc)) from exc


def serve(metrics: WorkerMetrics, address: str, port: int) -> Any:
    """Serve the worker's metrics and this process's enqueue counters; returns the server."""
    process.install()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.registry)
    registry.register(process.collector())
    try:
        server, _thread = start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        raise PortTaken(_taken(address, port, exc)) from exc
    return server


def slot_runner(address: str, port: int, *, processes: int) -> Callable[[WorkerOptions, int], int]:
    """Run the worker of slot i serving its metrics on port + i; checks every port first.

    Raises PortTaken before any worker starts. A child that cannot bind its
    port later (taken since) logs it and exits 1, and its supervisor retries.
    """
    ports = range(port, port + processes)
    if ports[-1] > MAX_PORT:
        raise PortTaken(
            f"--metrics-port {port} with --processes {processes} needs ports up to "
            f"{ports[-1]}; the highest port is {MAX_PORT}."
        )
    for each in ports:
        check_port(address, each)

    def run(options: WorkerOptions, slot: int) -> int:
        metrics = WorkerMetrics()
        try:
            serve(metrics, address, port + slot)
        except PortTaken as exc:
            if processes == 1:
                raise
            logger.error("%s", exc)
            return 1
        logger.info("serving metrics on %s:%d", address, port + slot)
        return Worker(replace(options, instrument=metrics)).run_to_exit()

    return run


def _taken(address: str, port: int, exc: OSError) -> str:
    return f"Cannot serve metrics on {address}:{port}: {exc.strerror or exc}."
