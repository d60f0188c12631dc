"""The worker registry service: each worker process's row in `conveyor_worker`.

A worker registers when it starts, refreshes its row with every heartbeat
(last seen, leases held) and marks it stopped on a clean exit. A row whose
heartbeat is older than a lease belongs to a lost worker (killed, frozen,
cut off): the admin shows it as lost. Any worker's refresh also forgets
rows stopped longer than STOPPED_RETENTION_SECONDS or lost longer than
LOST_RETENTION_SECONDS, so the table stays the size of the fleet.

This table is not `conveyor_job`: its statements live here, not in the protocol.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from typing import Any, NamedTuple

from ...protocol import Cursor

DEFAULT_INTERVAL_SECONDS = 10.0  # The worker runs it at its heartbeat interval.
STOPPED_RETENTION_SECONDS = 600.0  # A clean stop stays visible this long.
LOST_RETENTION_SECONDS = 86400.0  # A lost worker stays visible a day.

REGISTER = """
INSERT INTO conveyor_worker (
    id, host, pid, queues, concurrency, started_at, last_seen_at, leases_held, version, stopped_at
) VALUES (
    %(id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, now(), now(), 0, %(version)s,
    NULL
)
ON CONFLICT (id) DO UPDATE
SET last_seen_at = now(), stopped_at = NULL, leases_held = 0, may_start = NULL
"""

# A row forgotten while this worker was cut off is written again, as it was.
REFRESH = """
INSERT INTO conveyor_worker (
    id, host, pid, queues, concurrency, started_at, last_seen_at, leases_held, version, stopped_at
) VALUES (
    %(id)s, %(host)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s, %(started_at)s, now(),
    %(leases_held)s, %(version)s, NULL
)
ON CONFLICT (id) DO UPDATE
SET last_seen_at = now(), leases_held = EXCLUDED.leases_held, stopped_at = NULL
"""

STOP = """
UPDATE conveyor_worker SET stopped_at = now(), last_seen_at = now(), leases_held = 0
WHERE id = %(id)s
"""

FORGET = """
DELETE FROM conveyor_worker
WHERE stopped_at < now() - make_interval(secs => %(stopped)s)
   OR (stopped_at IS NULL AND last_seen_at < now() - make_interval(secs => %(lost)s))
"""


def package_version() -> str:
    try:
        return metadata.version("django-conveyor")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerInfo:
    """What a worker process says about itself."""

    id: str  # The lease_owner its claims write.
    queues: tuple[str, ...]
    concurrency: int
    host: str = socket.gethostname()
    pid: int = os.getpid()
    version: str = package_version()


class RegistryCounts(NamedTuple):
    registry_refreshed: int = 0  # This worker's row (1, or 0 when not registered yet).
    workers_forgotten: int = 0  # Rows of long-stopped or long-lost workers deleted.


class Registry:
    """One worker's row: register, refresh with the heartbeat, stop (a service)."""

    name = "registry"
    while_draining = True  # A draining worker is still alive: keep its row fresh.

    def __init__(
        self,
        info: WorkerInfo,
        *,
        leases_held: Callable[[], int] = lambda: 0,
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        self.info = info
        self.leases_held = leases_held
        self.interval = interval
        self.started_at: datetime | None = None

    def _params(self) -> dict[str, Any]:
        info = self.info
        return {
            "id": info.id,
            "host": info.host[:255],
            "pid": info.pid,
            "queues": json.dumps(list(info.queues)),
            "concurrency": info.concurrency,
            "version": info.version[:32],
        }

    def register(self, cursor: Cursor) -> None:
        cursor.execute(REGISTER + " RETURNING started_at", self._params())
        self.started_at = cursor.fetchall()[0][0]

    def run_once(self, cursor: Cursor, now: Any = None) -> RegistryCounts:
        """Refresh this worker's row and forget long-gone ones."""
        if self.started_at is None:
            self.register(cursor)
        params = {**self._params(), "started_at": self.started_at}
        cursor.execute(REFRESH, {**params, "leases_held": self.leases_held()})
        refreshed = cursor.rowcount
        cursor.execute(
            FORGET, {"stopped": STOPPED_RETENTION_SECONDS, "lost": LOST_RETENTION_SECONDS}
        )
        return RegistryCounts(refreshed, cursor.rowcount)

    def stop(self, cursor: Cursor) -> None:
        """A clean exit: the row says so, and is forgotten after a while."""
        if self.started_at is not None:
            cursor.execute(STOP, {"id": self.info.id})
