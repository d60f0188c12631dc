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
from collections.abc import Callable, Iterable
from typing import NamedTuple

from ...protocol import Cursor
from ...tasks import task_or_none
from .. import attempts
from ..attempts import Attempt, error_entry
from ..backoff import retry_delay
from ..holdings import Holdings
from ..instrument import log_job
from .base import Now

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 0.0  # Every pass: the check is a walk over the running attempts.


class TimeoutCounts(NamedTuple):
    timed_out: int = 0  # Attempts given up on by this pass.


class Timeouts:
    name = "timeouts"
    interval = DEFAULT_INTERVAL_SECONDS
    while_draining = False  # At shutdown, leftovers are handed back instead.

    def __init__(
        self,
        holdings: Holdings,
        *,
        abandon: Callable[[Attempt], object] | None = None,
        running: Callable[[], Iterable[Attempt]] | None = None,
    ) -> None:
        self.holdings = holdings
        self.abandon = abandon  # Gives the handler's slot to a new thread.
        # The attempts whose handlers run now (the slots'): a pass then walks
        # the slots, not a deep claim-ahead buffer. None: every held attempt.
        self.running = running or (lambda: list(holdings.held.values()))

    def run_once(self, cursor: Cursor | None, now: Now) -> TimeoutCounts:
        timed_out = 0
        for attempt in self.running():
            if (
                attempt.started_at is None
                or attempt.timeout is None
                or attempt.finished_at is not None
            ):
                continue
            if now.monotonic - attempt.started_at < attempt.timeout:
                continue
            if attempt.in_atomic or attempt.completed_in_atomic:
                continue  # Its guarded block decides.
            lease = attempt.lease
            error = error_entry(
                TimeoutError(f"The attempt ran past its timeout of {attempt.timeout:g} seconds.")
            )
            delay = retry_delay(task_or_none(lease.task_path), lease.attempt)
            outcome = attempts.retry(attempt, delay, error)
            if self.holdings.give_up(attempt, outcome, f"timed out after {attempt.timeout:g}s"):
                timed_out += 1
                log_job(logger, logging.WARNING, lease, "timed out after %gs", attempt.timeout)
                if self.abandon is not None:
                    self.abandon(attempt)
        return TimeoutCounts(timed_out=timed_out)
