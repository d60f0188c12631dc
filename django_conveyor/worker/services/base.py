"""The shape every maintenance service shares, and the schedule that runs them.

A service is a small object with

- `name`, for its log lines;
- `interval`: seconds between passes (0 runs it on every pass of the loop);
- `while_draining`: whether it keeps running during a graceful shutdown;
- `run_once(cursor, now) -> counts`: one pass, on the control loop's
  connection, returning a NamedTuple of ints that the worker adds to its
  counters under the field names. Tests call it directly.

A service whose next pass depends on what it found keeps its own
`next_due` (monotonic), which the schedule then follows instead of
`interval` (the cron scheduler wakes for the next tick), and may have a
`failed()` method, called after a pass that raised.

The worker builds its services in `Worker.services()` (heartbeat, limits, claim
order, reaper, gates, timeouts, the cron scheduler, the vacuum); the worker
registry plugs in there too. The control loop calls `Timetable.run_due` on
every pass, which runs each service that is due, logs a failure and carries
on; only a lost connection goes up to the loop, which reconnects.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

import psycopg
from django.db import transaction

from ...protocol import Cursor
from ..connections import is_read_only
from ..instrument import Counters

logger = logging.getLogger(__name__)


def transaction_of(cursor: Any) -> Any:
    """One transaction around a service's statements that must commit together.

    The worker's control connection is in autocommit, so each statement is
    its own transaction unless a service opens one; a Django cursor (tests,
    `testing.py`) gets an atomic block of its connection instead.
    """
    django_connection = getattr(cursor, "db", None)
    if django_connection is not None:
        return transaction.atomic(using=django_connection.alias)
    return cursor.connection.transaction()


class Now(NamedTuple):
    """One reading of the worker's clocks, shared by the services of a pass."""

    monotonic: float  # time.monotonic(): for the worker's own deadlines.
    utc: datetime  # Wall clock, for instants a service names (cron ticks).

    @classmethod
    def read(cls) -> Now:
        return cls(time.monotonic(), datetime.now(UTC))


class Counts(Protocol):
    def _asdict(self) -> dict[str, int]: ...


class Service(Protocol):
    name: str
    interval: float
    while_draining: bool

    def run_once(self, cursor: Cursor, now: Now) -> Counts: ...


# Errors that mean the connection itself is gone: the loop reconnects. So it
# does when the server takes no writes (connections.is_read_only).
CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


class Timetable:
    """When each service runs next."""

    def __init__(self, services: list[Service], counters: Counters) -> None:
        self.services = services
        self.counters = counters
        self.due = dict.fromkeys((s.name for s in services), 0.0)  # monotonic

    def due_at(self, service: Service) -> float:
        """When `service` runs next (monotonic): its own `next_due`, if it keeps one."""
        return getattr(service, "next_due", self.due[service.name])

    def run_due(self, conn: psycopg.Connection, now: Now, *, draining: bool = False) -> None:
        """Run every service that is due; a service that fails is logged and retried."""
        with conn.cursor() as cur:
            for service in self.services:
                if draining and not service.while_draining:
                    continue
                if now.monotonic < self.due_at(service):
                    continue
                self.due[service.name] = now.monotonic + service.interval
                try:
                    counts = service.run_once(cur, now)
                except Exception as exc:
                    if isinstance(exc, CONNECTION_ERRORS) or is_read_only(exc):
                        self.due[service.name] = 0.0  # First thing after the reconnect.
                        raise  # The loop reconnects (and says why, in one line).
                    logger.exception(
                        "%s failed; it runs again in %.1fs", service.name, service.interval
                    )
                    if failed := getattr(service, "failed", None):
                        failed()  # Its own clean-up (a connection it may have broken).
                else:
                    self.counters.update(counts._asdict())

    def earliest_due(self) -> float:
        """When the next service with an interval is due (monotonic; inf when none)."""
        return min((self.due_at(s) for s in self.services if s.interval > 0), default=float("inf"))
