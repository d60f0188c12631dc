"""The reaper: take back expired leases of any worker, in this worker's database.

A job whose lease expired (`lease_expires_at < now()`, the database's
clock) goes back to `available` with a `LeaseLost` entry in its errors, or
to `dead` if it has used all its attempts (protocol.REAP). Rows locked by a
handler's `context.atomic()` are skipped: the lock proves the holder is
alive. Every worker reaps, so recovery needs no leader.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from ... import protocol
from ...conf import DEFAULT_REAP_SECONDS
from ...protocol import Cursor
from ...states import JobState
from ..instrument import log_job
from .base import Now

logger = logging.getLogger("django_conveyor.worker")

DEFAULT_INTERVAL_SECONDS = DEFAULT_REAP_SECONDS  # CONVEYOR["REAP_SECONDS"]
BATCH = 500  # Leases taken back per pass, at most: a short statement, even after an outage.


class ReapCounts(NamedTuple):
    reaped: int = 0  # Jobs taken back, whatever became of them.
    reaped_dead: int = 0  # Of those, the ones out of attempts (now dead).


class Reaper:
    name = "reaper"
    while_draining = False

    def __init__(self, *, interval: float = DEFAULT_INTERVAL_SECONDS, batch: int = BATCH) -> None:
        self.interval = interval
        self.batch = batch

    def run_once(self, cursor: Cursor, now: Now) -> ReapCounts:
        reaped = protocol.reap(cursor, limit=self.batch)
        for row in reaped:
            log_job(
                logger, logging.WARNING, row, "reaped from worker %s: lease expired -> %s",
                row.owner, row.state,
            )  # fmt: skip
        dead = sum(row.state == JobState.DEAD for row in reaped)
        return ReapCounts(reaped=len(reaped), reaped_dead=dead)
