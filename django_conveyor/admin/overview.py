"""What the dashboard and the queues page show: `queue_counts` plus the console's own.

Per-queue counts come from `queue_counts.snapshot()`, the one source the metrics
and the API read too: live states exact, failed and dead exact up to
`queue_counts.EXACT_BELOW` and PostgreSQL's estimate above (marked on the page).
The console adds the throughput chart, from the partial index on finished
jobs restricted to the last hour and to CHART_BUDGET completions, and the
worker counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections

from .. import limits, queue_counts
from ..conf import conveyor_settings
from ..states import JobState

CHART_MINUTES = 60

CHART_BUDGET = 10_000  # Completions the chart counts at most: its cost, whatever the rate.

# Minute 0 is the current minute; the chart runs from minute 59 to minute 0.
# The newest completions first, at most CHART_BUDGET of them (a backward walk
# of conveyor_job_finished_idx that stops there), so the chart costs the same
# at 10 jobs an hour or at 10 million; past the budget it covers the recent
# minutes exactly and says so. A finished_at in the future (a row written by
# hand, 'infinity') is not counted: it would not be a minute of the chart.
COMPLETED_PER_MINUTE = """
SELECT queue, floor(extract(epoch FROM now() - finished_at) / 60)::int, count(*)
FROM (
    SELECT queue, finished_at FROM conveyor_job
    WHERE state = 'completed'
      AND finished_at > now() - make_interval(mins => %(minutes)s) AND finished_at <= now()
    ORDER BY finished_at DESC
    LIMIT %(budget)s
) AS recent
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
class QueueRow:
    name: str
    paused: bool = False
    ready: int = 0
    scheduled: int = 0
    blocked: int = 0
    running: int = 0
    failed: int = 0
    dead: int = 0
    lag_seconds: float | None = None  # Age of the oldest ready job; None when none is ready.
    estimated: set[str] = field(default_factory=set)  # Counts that are PostgreSQL's estimate.
    per_minute: list[int] = field(default_factory=lambda: [0] * CHART_MINUTES)  # Oldest first.
    limited: bool = False  # The queue has flow control (docs/flow-control.md).
    limits: str = "none"  # Its limits, as `Limits.describe()` writes them.
    throttled: int = 0  # Ready jobs waiting because a limit is reached.

    @classmethod
    def of(cls, counts: queue_counts.QueueCounts) -> QueueRow:
        jobs = counts.jobs
        return cls(
            name=counts.name,
            paused=counts.paused,
            ready=counts.ready,
            scheduled=counts.scheduled,
            blocked=jobs[JobState.BLOCKED],
            running=jobs[JobState.RUNNING],
            failed=jobs[JobState.FAILED],
            dead=jobs[JobState.DEAD],
            lag_seconds=counts.lag_seconds if counts.ready else None,
            estimated=set(counts.estimated),
            limited=counts.limited,
            limits=limits.of(counts).describe(),
            throttled=sum(counts.throttled.values()),
        )

    @property
    def completed_last_hour(self) -> int:
        return sum(self.per_minute)

    @property
    def peak(self) -> int:
        return max(self.per_minute, default=0)

    @property
    def lag_display(self) -> str:
        return "none ready" if self.lag_seconds is None else format_seconds(self.lag_seconds)

    @property
    def failed_display(self) -> str:
        return self._display(JobState.FAILED, self.failed)

    @property
    def dead_display(self) -> str:
        return self._display(JobState.DEAD, self.dead)

    def _display(self, state: str, count: int) -> str:
        return f"≈{count}" if state in self.estimated else str(count)


def queue_rows(known: Iterable[str] = ()) -> dict[str, QueueRow]:
    """Every queue's live and dead-letter counts, from every conveyor database."""
    counts = queue_counts.snapshot(known, finished=queue_counts.DEAD_LETTER_STATES)
    return {name: QueueRow.of(c) for name, c in counts.items()}


@dataclass(slots=True)
class Overview:
    queues: list[QueueRow]
    workers_live: int
    workers_lost: int
    database_time: datetime | None
    # The chart reached CHART_BUDGET: its counts cover only this many recent minutes.
    chart_minutes: int | None = None

    @property
    def chart_budget(self) -> str:
        return f"{CHART_BUDGET:,}"

    @property
    def total(self) -> QueueRow:
        total = QueueRow(name="all queues")
        for q in self.queues:
            for name in ("ready", "scheduled", "blocked", "running", "failed", "dead"):
                setattr(total, name, getattr(total, name) + getattr(q, name))
            total.per_minute = [a + b for a, b in zip(total.per_minute, q.per_minute, strict=True)]
            lags = [x for x in (total.lag_seconds, q.lag_seconds) if x is not None]
            total.lag_seconds = max(lags) if lags else None
            total.estimated |= q.estimated
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


def overview(known_queues: set[str]) -> Overview:
    """Per-queue numbers from every conveyor database, plus the worker counts."""
    by_name = queue_rows(known_queues)
    live = lost = 0
    database_time = None
    chart_minutes: int | None = None
    for database in conveyor_settings().databases():
        with connections[database].cursor() as cursor:
            cursor.execute(COMPLETED_PER_MINUTE, {"minutes": CHART_MINUTES, "budget": CHART_BUDGET})
            rows = cursor.fetchall()
            for name, minutes_ago, count in rows:
                queue = by_name.setdefault(name, QueueRow(name=name))
                index = CHART_MINUTES - 1 - min(max(minutes_ago, 0), CHART_MINUTES - 1)
                queue.per_minute[index] += count
            if sum(count for _, _, count in rows) >= CHART_BUDGET:
                # The oldest minute read may be partial: the chart is exact after it.
                reached = max(minutes_ago for _, minutes_ago, _ in rows)
                chart_minutes = reached if chart_minutes is None else min(reached, chart_minutes)
            cursor.execute(WORKER_COUNTS, {"lost_after": lost_after_seconds()})
            row_live, row_lost, now = cursor.fetchone()
            live, lost = live + row_live, lost + row_lost
            database_time = database_time or now
    queues = sorted(by_name.values(), key=lambda q: q.name)
    return Overview(queues, live, lost, database_time, chart_minutes)
