"""What a worker reports as it works: the metrics hook, its counters, its log lines.

`Instrument` is the hook a metrics exporter subscribes to. The worker calls
it at the points metrics need: jobs claimed, each outcome written (with its
kind and what the job became), each outcome the fence refused, each lease
lost, and the held and in-flight counts once per pass of the control loop.
Pass an instance as `WorkerOptions(instrument=...)`; without one (the
default) the worker skips every call, so an unobserved worker pays nothing.
The base class's methods do nothing: a subclass overrides what it needs.

Every call comes from the control-loop thread, between database round
trips: keep methods quick and never raise (an exception would count as a
control-loop error). `Lease` carries the labels (`queue`, `task_path`) and
`Lease.pickup_delay`, the seconds from when the job was due to its claim.

`Counters` are the worker's own counts, logged when it stops.

`log_job` writes a log line that says which job, task, queue, attempt and
token it is about, and passes the same fields as `extra=`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..protocol import Lease


class Instrument:
    """Override the events you need; each default does nothing."""

    def claimed(self, leases: Sequence[Lease]) -> None:
        """A claim returned these leases (their `pickup_delay` is known now)."""

    def outcome_written(self, kind: str, result: str, lease: Lease, duration: float | None) -> None:
        """An outcome committed.

        `kind` is what the attempt asked for (`attempts.COMPLETE`, `RETRY`,
        ...); `result` what the job became: completed, retried, dead, failed,
        snoozed or released. `duration` is the handler's run time in seconds,
        or None when the loop decided without it (a timeout, a hand-back).
        """

    def outcome_refused(self, kind: str, lease: Lease) -> None:
        """An outcome was not written: the lease was gone (the fence, or known lost)."""

    def lease_lost(self, lease: Lease, reason: str) -> None:
        """A heartbeat found that another party holds the job now."""

    def leases_counted(self, *, held: int, in_flight: int) -> None:
        """Once per pass: leases held (buffered or running), handlers running."""


@dataclass(slots=True)
class Counters:
    """Counters of one worker process, logged when it stops."""

    counts: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def update(self, counts: Mapping[str, int]) -> None:
        for name, n in counts.items():
            if n:
                self.counts[name] += n


class JobFields(Protocol):
    """What a line about a job names: a claimed `Lease`, or a `Reaped` row."""

    id: int
    task_path: str
    queue: str
    attempt: int
    version: int
    owner: str | None


def job_extra(lease: JobFields) -> dict[str, Any]:
    """Fields for `extra=`, so structured handlers can index them."""
    return {
        "job_id": lease.id,
        "task": lease.task_path,
        "queue": lease.queue,
        "attempt": lease.attempt,
        "token": lease.version,
        "worker_id": lease.owner,  # The token's owner: who holds (or, reaped, held) the lease.
    }


def job_label(lease: JobFields) -> str:
    return (
        f"job={lease.id} task={lease.task_path} queue={lease.queue} "
        f"attempt={lease.attempt} token={lease.version}"
    )


def log_job(
    logger: logging.Logger, level: int, lease: JobFields, message: str, *args: Any, **kw: Any
) -> None:
    """Log `message` prefixed with the job's fields, and the same fields as extras."""
    if logger.isEnabledFor(level):
        logger.log(level, f"{job_label(lease)} {message}", *args, extra=job_extra(lease), **kw)
