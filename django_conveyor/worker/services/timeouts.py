"""Timeouts: give up on attempts that ran past their task's `timeout`.

Python cannot stop a thread, so the handler keeps running; the worker
marks its lease lost (`context.lease_held()` turns false) and turns the
attempt into a RETRY outcome, written with the cycle's other outcomes and
guarded by the attempt's token. The handler's own outcome, if it ever
returns, is then stale. Its slot is abandoned (slots.py): a new thread
takes its place, so a handler that never returns costs a thread, not a
slot, and does not keep `--burst` from finishing. An attempt inside `context.atomic()` is left until
its block ends: the block holds the row, and it either commits (the job is
completed) or rolls back.

Measured on the worker's monotonic clock from when a slot started the
attempt, on every pass of the control loop (so up to about one poll
interval late).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from ...protocol import Cursor
from ...tasks import task_or_none
from .. import outcomes
from ..backoff import retry_delay
from ..holdings import HeldLease, Leases
from ..logs import log_job
from ..outcomes import error_entry
from .base import Now

logger = logging.getLogger("django_conveyor.worker")

DEFAULT_INTERVAL_SECONDS = 0.0  # Every pass: the check is a walk over the held leases.


class TimeoutCounts(NamedTuple):
    timed_out: int = 0  # Attempts given up on by this pass.


class Timeouts:
    name = "timeouts"
    interval = DEFAULT_INTERVAL_SECONDS
    while_draining = False  # At shutdown, leftovers are handed back instead.

    def __init__(
        self, leases: Leases, *, abandon: Callable[[HeldLease], object] | None = None
    ) -> None:
        self.leases = leases
        self.abandon = abandon  # Gives the handler's slot to a new thread.

    def run_once(self, cursor: Cursor | None, now: Now) -> TimeoutCounts:
        timed_out = 0
        for held in list(self.leases.held.values()):
            if held.started_at is None or held.timeout is None or held.finished_at is not None:
                continue
            if now.monotonic - held.started_at < held.timeout:
                continue
            if held.in_atomic or held.completed_in_atomic:
                continue  # Its guarded block decides.
            lease = held.lease
            error = error_entry(
                TimeoutError(f"The attempt ran past its timeout of {held.timeout:g} seconds.")
            )
            delay = retry_delay(task_or_none(lease.task_path), lease.attempt)
            outcome = outcomes.retry(held, delay, error)
            if self.leases.give_up(held, outcome, f"timed out after {held.timeout:g}s"):
                timed_out += 1
                log_job(logger, logging.WARNING, lease, "timed out after %gs", held.timeout)
                if self.abandon is not None:
                    self.abandon(held)
        return TimeoutCounts(timed_out=timed_out)
