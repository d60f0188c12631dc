"""The reaper: take back expired leases of any worker, in this worker's database.

A job whose lease expired (`lease_expires_at < now()`, the database's
clock) goes back to `available` with a `LeaseLost` entry in its errors, or
to `dead` if it has used all its attempts (protocol.REAP). Rows locked by a
handler's `context.atomic()` are skipped: the lock proves the holder is
alive. Every worker reaps, so recovery needs no leader.

A pass drains: it repeats REAP, a batch of at most BATCH rows each (a short
statement that skips locked rows), until a batch comes back short, so that
a backlog of expired leases (after an outage, a crash of a busy fleet) is
back in one pass rather than one batch per interval. It is bounded by
MAX_BATCHES statements: a pass takes back at most BATCH * MAX_BATCHES
leases, so the control loop's heartbeat and claims never wait long for it;
what is left is the next pass's.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from ... import protocol
from ...conf import DEFAULT_REAP_SECONDS
from ...protocol import Cursor
from ...states import JobState
from ..instrument import log_job
from .base import Now, transaction_of

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = DEFAULT_REAP_SECONDS  # CONVEYOR["REAP_SECONDS"]
BATCH = 500  # Leases one REAP statement takes back, at most: a short statement.
MAX_BATCHES = 40  # REAP statements per pass, at most: 20,000 leases, then the next pass.


class ReapCounts(NamedTuple):
    reaped: int = 0  # Jobs taken back, whatever became of them.
    reaped_dead: int = 0  # Of those, the ones out of attempts (now dead).
    reaped_cancelled: int = 0  # Of those, the ones an operator asked to cancel (now cancelled).
    reaped_unstarted: int = 0  # Of those, the ones their worker never listed as started.


class Reaper:
    name = "reaper"
    while_draining = False

    def __init__(
        self,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        batch: int = BATCH,
        max_batches: int = MAX_BATCHES,
    ) -> None:
        self.interval = interval
        self.batch = batch
        self.max_batches = max_batches

    def run_once(self, cursor: Cursor, now: Now) -> ReapCounts:
        """REAP batch after batch until one comes back short (or MAX_BATCHES ran)."""
        reaped: list[protocol.Reaped] = []
        for _ in range(self.max_batches):
            # REAP and the settling of a dead job's dependents commit together:
            # a worker that dies between the two would leave them blocked.
            with transaction_of(cursor):
                batch = protocol.reap(cursor, limit=self.batch)
            reaped += batch
            if len(batch) < self.batch:
                break
        for row in reaped:
            log_job(
                logger, logging.WARNING, row, "reaped from worker %s: lease expired -> %s%s",
                row.owner, row.state,
                "" if row.started else " (never started: its attempt given back)",
            )  # fmt: skip
        return ReapCounts(
            reaped=len(reaped),
            reaped_unstarted=sum(not row.started for row in reaped),
            reaped_dead=sum(row.state == JobState.DEAD for row in reaped),
            reaped_cancelled=sum(row.state == JobState.CANCELLED for row in reaped),
        )
