"""The numbers the dashboard and the queues page show, in a few indexed queries.

Nothing here counts the whole table: live states come from the index on
(state, id), which carries the queue; throughput from the partial index on
finished jobs, restricted to the last hour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections

from ..conf import conveyor_settings
from ..models import Queue

CHART_MINUTES = 60
LIVE_STATES = ("blocked", "available", "running", "failed", "dead")

QUEUE_COUNTS = """
SELECT queue,
       count(*) FILTER (WHERE state = 'available' AND run_after <= now()),
       count(*) FILTER (WHERE state = 'available' AND run_after > now()),
       count(*) FILTER (WHERE state = 'blocked'),
       count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'failed'),
       count(*) FILTER (WHERE state = 'dead'),
       extract(epoch FROM now() - min(run_after)
               FILTER (WHERE state = 'available' AND run_after <= now()))
FROM conveyor_job
WHERE state IN ('blocked', 'available', 'running', 'failed', 'dead')
GROUP BY queue
"""

# Minute 0 is the current minute; the chart runs from minute 59 to minute 0.
COMPLETED_PER_MINUTE = """
SELECT queue, floor(extract(epoch FROM now() - finished_at) / 60)::int, count(*)
FROM conveyor_job
WHERE state = 'completed' AND finished_at > now() - make_interval(mins => %(minutes)s)
GROUP BY 1, 2
"""

WORKER_COUNTS = """
SELECT count(*) FILTER (WHERE last_seen_at >= now() - make_interval(secs => %(lost_after)s)),
       count(*) FILTER (WHERE last_seen_at < now() - make_interval(secs => %(lost_after)s)),
       now()
FROM conveyor_worker
WHERE stopped_at IS NULL
"""


@dataclass(slots=True)
class QueueStats:
    name: str
    paused: bool = False
    ready: int = 0
    scheduled: int = 0
    blocked: int = 0
    running: int = 0
    failed: int = 0
    dead: int = 0
    lag_seconds: float | None = None  # Age of the oldest ready job.
    per_minute: list[int] = field(default_factory=lambda: [0] * CHART_MINUTES)  # Oldest first.

    @property
    def completed_last_hour(self) -> int:
        return sum(self.per_minute)

    @property
    def peak(self) -> int:
        return max(self.per_minute, default=0)

    @property
    def lag_display(self) -> str:
        return "none ready" if self.lag_seconds is None else format_seconds(self.lag_seconds)


@dataclass(slots=True)
class Overview:
    queues: list[QueueStats]
    workers_live: int
    workers_lost: int
    database_time: datetime | None

    @property
    def total(self) -> QueueStats:
        total = QueueStats(name="all queues")
        for q in self.queues:
            for name in ("ready", "scheduled", "blocked", "running", "failed", "dead"):
                setattr(total, name, getattr(total, name) + getattr(q, name))
            total.per_minute = [a + b for a, b in zip(total.per_minute, q.per_minute, strict=True)]
            lags = [x for x in (total.lag_seconds, q.lag_seconds) if x is not None]
            total.lag_seconds = max(lags) if lags else None
        return total


def format_seconds(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def lost_after_seconds() -> float:
    """A worker whose heartbeat is older than a lease is counted as lost."""
    return conveyor_settings().LEASE_SECONDS


def count_queues(cursor: Any, by_name: dict[str, QueueStats]) -> dict[str, QueueStats]:
    """Fill in each queue's live counts and lag (one grouped query); adds unknown queues."""
    cursor.execute(QUEUE_COUNTS)
    for name, *counts, lag in cursor.fetchall():
        stats = by_name.setdefault(name, QueueStats(name=name))
        (stats.ready, stats.scheduled, stats.blocked, stats.running, stats.failed,
         stats.dead) = counts  # fmt: skip
        stats.lag_seconds = float(lag) if lag is not None else None
    return by_name


def overview(known_queues: set[str]) -> Overview:
    """Per-queue numbers from every conveyor database, plus the worker counts."""
    settings = conveyor_settings()
    by_name = {name: QueueStats(name=name) for name in known_queues}
    live = lost = 0
    database_time = None
    for database in settings.databases():
        for name, paused in Queue.objects.using(database).values_list("name", "paused"):
            by_name.setdefault(name, QueueStats(name=name)).paused = paused
        with connections[database].cursor() as cursor:
            count_queues(cursor, by_name)
            cursor.execute(COMPLETED_PER_MINUTE, {"minutes": CHART_MINUTES})
            for name, minutes_ago, count in cursor.fetchall():
                stats = by_name.setdefault(name, QueueStats(name=name))
                index = CHART_MINUTES - 1 - min(max(minutes_ago, 0), CHART_MINUTES - 1)
                stats.per_minute[index] += count
            cursor.execute(WORKER_COUNTS, {"lost_after": lost_after_seconds()})
            row_live, row_lost, now = cursor.fetchone()
            live, lost = live + row_live, lost + row_lost
            database_time = database_time or now
    return Overview(sorted(by_name.values(), key=lambda q: q.name), live, lost, database_time)
