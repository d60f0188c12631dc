"""Log lines that always say which job, task, queue, attempt and token."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .protocol import Lease


def job_extra(lease: Lease) -> dict[str, Any]:
    """Fields for `extra=`, so structured handlers can index them."""
    return {
        "job_id": lease.id,
        "task": lease.task_path,
        "queue": lease.queue,
        "attempt": lease.attempt,
        "token": lease.version,
        "worker_id": lease.owner,  # The token's owner, as the claim returned it.
    }


def job_label(lease: Lease) -> str:
    return (
        f"job={lease.id} task={lease.task_path} queue={lease.queue} "
        f"attempt={lease.attempt} token={lease.version}"
    )


def log_job(
    logger: logging.Logger, level: int, lease: Lease, message: str, *args: Any, **kw: Any
) -> None:
    """Log `message` prefixed with the job's fields, and the same fields as extras."""
    if logger.isEnabledFor(level):
        logger.log(level, f"{job_label(lease)} {message}", *args, extra=job_extra(lease), **kw)
