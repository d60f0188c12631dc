"""Read-only figures about queues, cheap at any size of finished history.

The one source of per-queue counts: the metrics view, the API's
`GET /queues`, and the admin's dashboard and queues page all read
`snapshot()`. Nothing here writes.

How each figure is found (docs/metrics.md says the same for operators):

- Jobs that are blocked, available or running are counted exactly. Each
  count reads only its own rows, through `conveyor_job_list_idx`
  `(state, queue, id)` (the running ones, which it leaves out, through
  `conveyor_job_reap_idx`), so its cost follows the backlog, not the history.
- Finished jobs (completed, failed, dead, cancelled) are counted exactly up
  to `EXACT_BELOW` per queue and state, with a count that stops reading
  there; above it the figure is PostgreSQL's own estimate (`EXPLAIN`, from
  the statistics that autovacuum keeps, helped by the multivariate
  statistics object on (state, queue) made by migration 0004). A scrape
  therefore reads at most `EXACT_BELOW` index entries per finished state
  and queue, however many millions are finished.
- Ready jobs and queue lag: available jobs whose `run_after` has passed
  (the rest of the available ones are scheduled), and the age of the
  oldest of them (0 when none is ready), by the database's clock.
- Leases: running jobs whose lease is still valid, and those that expired
  and wait for the reaper, through the partial index on running jobs.
- Limits and throttled jobs (flow control): each queue's limits from its
  `conveyor_queue` row, and, for the queues that have limits only, the
  ready jobs that wait because a limit is reached (`THROTTLED`). A site
  whose queues have no limits runs no query for them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import connections

from .bounds import EARLIEST_INSTANT
from .conf import conveyor_settings
from .states import JobState

EXACT_BELOW = 10_000
LIVE_STATES = (JobState.BLOCKED, JobState.AVAILABLE, JobState.RUNNING)
FINISHED_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.DEAD, JobState.CANCELLED)
DEAD_LETTER_STATES = (JobState.FAILED, JobState.DEAD)

# The running jobs apart: conveyor_job_list_idx leaves them out, and
# conveyor_job_reap_idx has them, by queue.
COUNT_LIVE = """
SELECT queue, state, count(*) FROM conveyor_job
WHERE state = ANY(%(states)s) AND state <> 'running'
GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*) FROM conveyor_job
WHERE state = 'running' AND 'running' = ANY(%(states)s)
GROUP BY queue
"""

# A loose index scan: one index probe per distinct queue, instead of reading
# every finished row to learn which queues have any.
QUEUES_IN_STATE = """
WITH RECURSIVE q AS (
    (SELECT queue FROM conveyor_job WHERE state = %(state)s ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM conveyor_job AS j
            WHERE j.state = %(state)s AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
"""

ESTIMATE_IN_STATE = (
    "EXPLAIN (FORMAT JSON) SELECT 1 FROM conveyor_job WHERE state = %(state)s AND queue = %(queue)s"
)

COUNT_IN_STATE_BOUNDED = """
SELECT count(*) FROM (
    SELECT 1 FROM conveyor_job WHERE state = %(state)s AND queue = %(queue)s LIMIT %(limit)s
) AS bounded
"""

# The oldest due time no earlier than Python can show: a row's '-infinity'
# would make the subtraction raise (and lag past any meaning).
READY = f"""
SELECT queue, count(*),
       EXTRACT(EPOCH FROM now() - greatest(min(run_after), '{EARLIEST_INSTANT.isoformat()}'))
           ::float8
FROM conveyor_job
WHERE state = 'available' AND run_after <= now()
GROUP BY queue
"""

LEASES = """
SELECT queue,
       count(*) FILTER (WHERE lease_expires_at >= now()),
       count(*) FILTER (WHERE lease_expires_at < now())
FROM conveyor_job
WHERE state = 'running'
GROUP BY queue
"""

QUEUE_ROWS = """
SELECT name, paused, concurrency, key_concurrency, rate_count, rate_seconds, fair
FROM conveyor_queue
"""

THROTTLE_REASONS = ("concurrency", "rate", "key_concurrency")

# Ready jobs (available, due, not isolated) of one limited, unpaused queue
# that wait because a limit is reached. A job is counted once, under the
# first reason that holds, in THROTTLE_REASONS' order: while the queue's
# running jobs reach `concurrency`, or its rate window is full (the starts
# CLAIM_LIMITED logged in rate_times/rate_counts in the last rate_seconds
# reach rate_count), every ready job waits for that; otherwise the ready jobs
# whose key has `key_concurrency` running jobs wait for their key. One
# statement per limited queue, so the planner sees the queue's own figures:
# the running jobs up to `concurrency` through conveyor_job_reap_idx; then
# (CASE runs one branch) either the ready jobs through
# conveyor_job_claim_queue_idx, or the keys at their limit through
# conveyor_job_key_running_idx and each one's ready jobs through
# conveyor_job_key_ready_idx. The clock is the database's.
THROTTLED = """
WITH q AS MATERIALIZED (
    SELECT q.key_concurrency,
           q.concurrency IS NOT NULL AND (
               SELECT count(*) FROM (
                   SELECT 1 FROM conveyor_job AS r
                   WHERE r.state = 'running' AND r.queue = %(queue)s LIMIT q.concurrency
               ) AS counted) >= q.concurrency AS at_concurrency,
           q.rate_count IS NOT NULL AND (
               SELECT coalesce(sum(w.c), 0) FROM unnest(q.rate_times, q.rate_counts) AS w(t, c)
               WHERE w.t > date_part('epoch', now()) - q.rate_seconds) >= q.rate_count AS at_rate
    FROM conveyor_queue AS q
    WHERE q.name = %(queue)s AND NOT q.paused
      AND (q.concurrency IS NOT NULL OR q.key_concurrency IS NOT NULL OR q.rate_count IS NOT NULL)
)
SELECT q.at_concurrency, q.at_rate, CASE
    WHEN q.at_concurrency OR q.at_rate THEN (
        SELECT count(*) FROM conveyor_job AS j
        WHERE j.state = 'available' AND j.queue = %(queue)s
          AND j.run_after <= now() AND NOT j.isolated)
    WHEN q.key_concurrency IS NOT NULL THEN (
        SELECT coalesce(sum((
            SELECT count(*) FROM conveyor_job AS j
            WHERE j.state = 'available' AND j.queue = %(queue)s AND j.concurrency_key = k.key
              AND j.run_after <= now() AND NOT j.isolated)), 0)::bigint
        FROM (
            SELECT r.concurrency_key AS key FROM conveyor_job AS r
            WHERE r.state = 'running' AND r.queue = %(queue)s AND r.concurrency_key IS NOT NULL
            GROUP BY r.concurrency_key HAVING count(*) >= q.key_concurrency
        ) AS k)
    ELSE 0 END
FROM q
"""


@dataclass(slots=True)
class QueueCounts:
    name: str
    paused: bool = False
    jobs: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in JobState})
    estimated: set[str] = field(default_factory=set)  # States whose count is an estimate.
    ready: int = 0  # Available jobs whose run_after has passed: a worker may take them now.
    lag_seconds: float = 0.0  # Age of the oldest ready job; 0 when none is ready.
    leases_active: int = 0
    leases_expired: int = 0  # Running jobs whose lease ran out, waiting for the reaper.
    # The limits of its conveyor_queue row (NULL, False: none), as `limits.of()` reads them.
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate_count: int | None = None  # Starts per rate_seconds.
    rate_seconds: int | None = None
    fair: bool = False
    # Ready jobs waiting for a limit, per reason (THROTTLE_REASONS); empty: no limit.
    throttled: dict[str, int] = field(default_factory=dict)

    @property
    def limited(self) -> bool:
        return (
            self.concurrency is not None
            or self.key_concurrency is not None
            or self.rate_count is not None
            or self.fair
        )

    @property
    def dead_letters(self) -> int:
        return sum(self.jobs[s] for s in DEAD_LETTER_STATES)

    @property
    def scheduled(self) -> int:
        """Available jobs waiting for their run_after (a retry's backoff, a deferred enqueue)."""
        return self.jobs[JobState.AVAILABLE] - self.ready


def _estimate(cursor, state: str, queue: str) -> int:
    cursor.execute(ESTIMATE_IN_STATE, {"state": state, "queue": queue})
    plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def _finished_count(cursor, state: str, queue: str) -> tuple[int, bool]:
    """(count, estimated): exact up to EXACT_BELOW, the planner's estimate above."""
    estimate = _estimate(cursor, state, queue)
    if estimate <= EXACT_BELOW:
        cursor.execute(
            COUNT_IN_STATE_BOUNDED, {"state": state, "queue": queue, "limit": EXACT_BELOW + 1}
        )
        counted = cursor.fetchone()[0]
        if counted <= EXACT_BELOW:
            return counted, False
    return max(estimate, EXACT_BELOW + 1), True


def throttled(cursor, names: Iterable[str]) -> dict[str, dict[str, int]]:
    """Ready jobs of the limited queues among `names` that wait for a limit, per reason.

    One entry per limited, unpaused queue of the cursor's database, with every
    reason of THROTTLE_REASONS (0 when it holds no job back).
    """
    found = {}
    for name in names:
        cursor.execute(THROTTLED, {"queue": name})
        row = cursor.fetchone()
        if row is None:
            continue  # No row, paused, or no limit that holds jobs back.
        at_concurrency, at_rate, waiting = row
        reason = "concurrency" if at_concurrency else "rate" if at_rate else "key_concurrency"
        found[name] = dict.fromkeys(THROTTLE_REASONS, 0) | {reason: waiting}
    return found


def _snapshot_of(
    database: str, queues: dict[str, QueueCounts], finished: Iterable[JobState]
) -> None:
    def queue(name: str) -> QueueCounts:
        return queues.setdefault(name, QueueCounts(name))

    with connections[database].cursor() as cursor:
        cursor.execute(QUEUE_ROWS)
        limited = []
        for name, paused, concurrency, key_concurrency, count, seconds, fair in cursor.fetchall():
            row = queue(name)
            row.paused |= paused
            row.concurrency, row.key_concurrency, row.fair = concurrency, key_concurrency, fair
            row.rate_count, row.rate_seconds = count, seconds
            if row.limited and not paused:
                limited.append(name)
        cursor.execute(COUNT_LIVE, {"states": [s.value for s in LIVE_STATES]})
        for name, state, count in cursor.fetchall():
            queue(name).jobs[state] += count
        for state in finished:
            cursor.execute(QUEUES_IN_STATE, {"state": state.value})
            for (name,) in cursor.fetchall():
                count, estimated = _finished_count(cursor, state.value, name)
                queue(name).jobs[state.value] += count
                if estimated:
                    queue(name).estimated.add(state.value)
        cursor.execute(READY)
        for name, ready, lag in cursor.fetchall():
            queue(name).ready += ready
            queue(name).lag_seconds = max(queue(name).lag_seconds, max(lag or 0.0, 0.0))
        cursor.execute(LEASES)
        for name, active, expired in cursor.fetchall():
            queue(name).leases_active += active
            queue(name).leases_expired += expired
        if limited:
            for name, counts in throttled(cursor, limited).items():
                queue(name).throttled = counts


def snapshot(
    known: Iterable[str] = (), *, finished: Iterable[JobState] = FINISHED_STATES
) -> dict[str, QueueCounts]:
    """Figures for every queue that has jobs or a row in conveyor_queue, plus `known`.

    Only the `finished` states are counted (the others stay 0): a page that
    shows dead letters alone asks for `DEAD_LETTER_STATES`.
    """
    queues = {name: QueueCounts(name) for name in known}
    finished = tuple(finished)
    for database in conveyor_settings().databases():
        _snapshot_of(database, queues, finished)
    return dict(sorted(queues.items()))
