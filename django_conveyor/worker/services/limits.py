"""The limits service: which of a worker's queues have flow control, refreshed.

Its first pass syncs CONVEYOR["QUEUES"] into the worker's database
(limits.sync), as the scheduler syncs CONVEYOR["CRON"]. Every pass then
reads which of the worker's queues carry limits, for the claimer
(claims.py), which sends those to CLAIM_LIMITED and the others to CLAIM.

That list is only a route, never the guard: CLAIM and CLAIM_ISOLATED refuse
jobs of a limited queue in their own SQL, and CLAIM_LIMITED reads the limits
under the queue row's lock. A limit set a moment ago is therefore held from
the next claim on; until this service's next pass sees it, the worker merely
leaves that queue alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db import connections

from ... import limits, protocol
from ...protocol import Cursor

logger = logging.getLogger(__name__)

INTERVAL_SECONDS = 2.0  # How soon a worker routes a queue whose limits were set or removed.


class LimitCounts(NamedTuple):
    limits_synced: int = 0


@dataclass
class LimitsService:
    queues: Sequence[str]
    # Claimer.route: the limited queues now, and those of them with a rate.
    route: Callable[[frozenset[str], frozenset[str]], None]
    database: str | None = None  # Sync CONVEYOR["QUEUES"] into it before the first pass.
    interval: float = INTERVAL_SECONDS
    name: str = "limits"
    while_draining: bool = False
    synced: bool = field(default=False)

    def run_once(self, cursor: Cursor, now: Any = None) -> LimitCounts:
        written = 0
        if self.database is not None and not self.synced:
            counts = limits.sync(self.database)
            if counts.written or counts.kept:
                logger.info(
                    "CONVEYOR['QUEUES'] synced into %r: limits written for %s, %d kept",
                    self.database, ", ".join(counts.names) or "none", counts.kept,
                )  # fmt: skip
            written = counts.written
            self.synced = True
        limited = protocol.limited_queues(cursor, queues=self.queues)
        self.route(frozenset(limited), frozenset(q for q, rated in limited.items() if rated))
        return LimitCounts(written)

    def failed(self) -> None:
        if self.database is not None:
            connections[self.database].close()  # The sync's connection may be broken.
