"""How a due tick of `conveyor_cron` becomes one job.

Every worker runs a pass (worker/services/scheduler.py, unless `--no-cron`),
so schedules keep running while any worker does, with no leader to elect.
Each tick is enqueued by
`protocol.CRON_ENQUEUE`, which inserts the tick's job under the key
`cron:<name>:<tick in UTC>` and advances the row in one statement, guarded
by the row's `next_tick_at`: however many schedulers run the same pass, one
of them writes each tick and the others match zero rows.

`run_once(cursor, now)` is one pass at the instant `now` (the database's
clock in the worker; any instant in tests) and returns counts. A pass reads
only the due rows through the partial index on `next_tick_at`, so it costs
next to nothing when nothing is due, and reports the earliest next tick so
the loop can sleep until exactly then.

Missed ticks. A tick is on time while it is at most GRACE_SECONDS old; an
older one was missed (no scheduler ran, or the schedule was disabled). On-
time ticks are always enqueued. Of the missed ones, `latest` enqueues the
most recent unless an on-time tick runs in the same pass, `all` enqueues
them all (the most recent BACKFILL_LIMIT), `skip` none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django import db

from .. import protocol
from ..conf import conveyor_settings
from ..serialization import loaded
from ..tasks import task_or_none
from . import expressions

# A standby's or a fenced primary's refusal (SQLSTATE 25006) is not this row's fault.
READ_ONLY = psycopg.errors.ReadOnlySqlTransaction

logger = logging.getLogger(__name__)

BATCH_SIZE = 500  # Due schedules per pass; more due means another pass at once.
GRACE_SECONDS = 60.0  # A tick older than this when its pass runs was missed.
BACKFILL_LIMIT = 100  # Missed ticks `all` enqueues per schedule and outage (the latest).

DUE = """
SELECT id, name, schedule, timezone, task_path, args, kwargs, queue, priority, missed,
       next_tick_at
FROM conveyor_cron
WHERE enabled AND next_tick_at <= %(now)s
ORDER BY next_tick_at, id
LIMIT %(limit)s
"""

NEXT_TICK = "SELECT min(next_tick_at) FROM conveyor_cron WHERE enabled"

# Skipping missed ticks writes no job, so it is not a protocol action; it is
# guarded like CRON_ENQUEUE so that it can never undo another scheduler's advance.
ADVANCE = f"""{protocol.CRON_ROW_GUARD}
UPDATE conveyor_cron AS c SET next_tick_at = %(next_tick)s FROM due WHERE c.id = due.id
"""

# A row whose expression or zone no longer parses stops (NULL is never due)
# until an operator fixes it, instead of failing every pass.
STOP = "UPDATE conveyor_cron SET next_tick_at = NULL WHERE id = %(cron_id)s"

NOW = "SELECT clock_timestamp()"


@dataclass
class Counts:
    due: int = 0  # Schedules with a due tick.
    enqueued: int = 0  # Jobs written for ticks.
    existing: int = 0  # Ticks whose key already named a job (nothing new written).
    missed: int = 0  # Schedules that had missed ticks (handled by their policy).
    raced: int = 0  # Schedules another scheduler advanced first.
    stopped: int = 0  # Schedules stopped: invalid expression, or a tick PostgreSQL refused.
    next_tick_at: datetime | None = None  # The earliest next tick after the pass.
    more: bool = False  # A full batch was due: run again at once.


@dataclass(frozen=True, slots=True)
class Plan:
    ticks: list[datetime]  # To enqueue, ascending.
    next_tick: datetime | None  # The row's next tick once they are.
    missed: bool = False  # Some ticks were older than the grace period.
    dropped: bool = False  # Some missed ticks are not among `ticks`.


def plan(timing: expressions.Timing, start: datetime, now: datetime, missed: str) -> Plan:
    """The ticks to enqueue for a row whose first unenqueued tick is `start`."""
    cutoff = now - timedelta(seconds=GRACE_SECONDS)
    on_time: list[datetime] = [start] if start >= cutoff else []
    after = start if on_time else cutoff - timedelta(microseconds=1)
    for tick in timing.ticks_after(after):
        if tick > now:
            break
        on_time.append(tick)
    next_tick = timing.next_after(now)
    if start >= cutoff:
        return Plan(on_time, next_tick)
    if missed == "skip":
        return Plan(on_time, next_tick, missed=True, dropped=True)
    if missed == "latest":
        if on_time:
            return Plan(on_time, next_tick, missed=True, dropped=True)
        latest = timing.between(start, cutoff, limit=1) or [start]
        return Plan(latest, next_tick, missed=True, dropped=latest[0] != start)
    backfill = timing.between(start, cutoff, limit=BACKFILL_LIMIT) or [start]
    return Plan(backfill + on_time, next_tick, missed=True, dropped=backfill[0] != start)


@dataclass(frozen=True, slots=True)
class DueRow:
    """A due schedule as DUE reads it."""

    id: int
    name: str
    schedule: str
    timezone: str
    task_path: str
    args: Any
    kwargs: Any
    queue: str
    priority: int
    missed: str
    next_tick_at: datetime


def run_once(cursor: protocol.Cursor, now: datetime, *, limit: int = BATCH_SIZE) -> Counts:
    """One pass at `now`: enqueue every due tick of up to `limit` schedules."""
    counts = Counts()
    cursor.execute(DUE, {"now": now, "limit": limit})
    rows = [DueRow(*r) for r in cursor.fetchall()]
    counts.due, counts.more = len(rows), len(rows) >= limit
    notify = conveyor_settings().NOTIFY
    for row in rows:
        try:
            timing = expressions.parsed(row.schedule, row.timezone)
        except expressions.InvalidSchedule as exc:
            cursor.execute(STOP, {"cron_id": row.id})
            counts.stopped += 1
            logger.error("schedule %s stopped until it is fixed: %s", row.name, exc)
            continue
        step = plan(timing, row.next_tick_at, now, row.missed)
        if step.missed:
            counts.missed += 1
            logger.warning(
                "schedule %s missed ticks from %s (missed=%s): enqueueing %d tick(s)%s",
                row.name, row.next_tick_at.isoformat(), row.missed, len(step.ticks),
                ", older ones dropped" if step.dropped else "",
            )  # fmt: skip
        try:
            _write(cursor, row, step, notify, counts)
        except Exception as exc:
            if isinstance(exc, psycopg.OperationalError | db.OperationalError | READ_ONLY):
                raise  # The connection (or a server that takes no writes), not this row.
            # A row PostgreSQL refuses stops its own schedule, never the pass.
            logger.exception("schedule %s stopped until it is fixed: tick refused", row.name)
            cursor.execute(STOP, {"cron_id": row.id})
            counts.stopped += 1
    cursor.execute(NEXT_TICK)
    counts.next_tick_at = cursor.fetchall()[0][0]
    return counts


def _write(cursor: protocol.Cursor, row: DueRow, step: Plan, notify: bool, counts: Counts) -> None:
    """Write the plan as a chain of guarded statements, each one atomic on its own.

    Each statement moves `next_tick_at` to the next tick it leaves to do, so
    a pass cut short anywhere leaves a row the next pass continues from.
    """
    expected = row.next_tick_at
    if not step.ticks:
        cursor.execute(
            ADVANCE, {"cron_id": row.id, "expected": expected, "next_tick": step.next_tick}
        )
        counts.raced += cursor.rowcount == 0
        return
    job = tick_job(row)
    for i, tick in enumerate(step.ticks):
        following = step.ticks[i + 1] if i + 1 < len(step.ticks) else step.next_tick
        written = protocol.cron_enqueue(
            cursor,
            cron_id=row.id,
            name=row.name,
            expected=expected,
            tick=tick,
            next_tick=following,
            job=job,
            notify=notify,
        )
        if written is None:
            counts.raced += 1
            return
        if written.created:
            counts.enqueued += 1
            logger.info("schedule %s: tick %s -> job %s", row.name, tick, written.job_id)
        else:
            counts.existing += 1
        expected = following


def tick_job(row: Any) -> protocol.NewJob:
    """The job a tick of this schedule enqueues (the task gives attempts and backend)."""
    task = task_or_none(row.task_path)
    return protocol.NewJob(
        task_path=row.task_path,
        args=loaded(row.args),
        kwargs=loaded(row.kwargs),
        queue=row.queue,
        backend=task.backend if task else "default",
        priority=row.priority,
        max_attempts=(getattr(task, "max_attempts", None) or conveyor_settings().MAX_ATTEMPTS),
    )


def database_now(cursor: protocol.Cursor) -> datetime:
    """The database's clock, now (not its transaction's start): ticks are computed from it."""
    cursor.execute(NOW)
    return cursor.fetchall()[0][0]
