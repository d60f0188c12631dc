"""Log lines that always say which job, task, queue, attempt and token."""

from __future__ import annotations

import logging
from typing import Any, Protocol


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
