"""The scheduler service: a worker's passes over `conveyor_cron` (periodic/ticks.py).

Every worker runs it (unless `--no-cron`). Its first pass syncs
CONVEYOR["CRON"] into the worker's database (periodic/schedules.py); every
pass then enqueues the due ticks (`ticks.run_once`, at the database's time)
and says when the next tick is due, so the loop sleeps until exactly then.
"""

from __future__ import annotations

import logging
import time
from dataclasses import astuple, dataclass
from typing import Any, NamedTuple

from django.db import connections

from ...periodic.schedules import sync
from ...periodic.ticks import database_now, run_once
from ...protocol import Cursor

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 1.0  # Longest sleep between passes: schedules added elsewhere show up.
WAKE_MARGIN_SECONDS = 0.001  # Wake just after the tick, not just before it.


class TickCounts(NamedTuple):
    """One pass of the service, as a worker adds it to its stats."""

    cron_enqueued: int = 0
    cron_existing: int = 0
    cron_missed: int = 0
    cron_raced: int = 0
    cron_stopped: int = 0


@dataclass
class SchedulerService:
    """The scheduler as one service of a worker's loop.

    The shape of the other services (`name`, `interval`, `while_draining`,
    `run_once(cursor, now) -> counts`), plus `next_due`: the loop's monotonic
    time of the next pass, which is at once if a batch was full, at the
    earliest next tick if that is sooner than `interval`, else one interval
    on. The first pass syncs CONVEYOR["CRON"] into `database`. Ticks are
    always computed at the database's time, whatever clock the loop passes.
    """

    database: str | None = None  # Sync CONVEYOR["CRON"] into it before the first pass.
    interval: float = INTERVAL_SECONDS
    name: str = "scheduler"
    while_draining: bool = False  # A worker that is shutting down enqueues no ticks.
    next_due: float = 0.0  # time.monotonic() of the next pass.
    synced: bool = False

    def due(self, monotonic_now: float) -> bool:
        return monotonic_now >= self.next_due

    def seconds_until_due(self, monotonic_now: float) -> float:
        return max(self.next_due - monotonic_now, 0.0)

    def run_once(self, cursor: Cursor, now: Any = None) -> TickCounts:
        self.next_due = time.monotonic() + self.interval  # Also the retry after a failure.
        if self.database is not None and not self.synced:
            added, updated, disabled = astuple(sync(self.database))
            logger.info(
                "CONVEYOR['CRON'] synced into %r: %d added, %d updated, %d disabled",
                self.database, added, updated, disabled,
            )  # fmt: skip
            self.synced = True
        started = time.monotonic()
        db_now = database_now(cursor)
        counts = run_once(cursor, db_now)
        delay = self.interval
        if counts.more:
            delay = 0.0
        elif counts.next_tick_at is not None:
            # The wait is measured on the database's clock, then slept on ours.
            until = (counts.next_tick_at - db_now).total_seconds() - (time.monotonic() - started)
            delay = min(delay, max(until, 0.0) + WAKE_MARGIN_SECONDS)
        self.next_due = time.monotonic() + delay
        return TickCounts(
            counts.enqueued, counts.existing, counts.missed, counts.raced, counts.stopped
        )

    def failed(self) -> None:
        """After an error: try again in one interval (the loop logs it)."""
        if self.database is not None:
            connections[self.database].close()  # The sync's connection may be broken.
        self.next_due = time.monotonic() + self.interval
