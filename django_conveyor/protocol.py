"""The lease protocol: every statement that changes a job's state.

Read this module against `spec/tla/Conveyor.tla`: each SQL constant is named
after the spec action it implements, and nothing else in the package writes
`conveyor_job`.

States and the only transitions (DESIGN §3)::

    available --CLAIM--> running --COMPLETE--> completed
    (blocked is reserved for jobs with dependencies; no statement creates it yet)
    available <--RETRY / SNOOZE / RELEASE / REAP-- running
    running --FAIL--> failed      running --RETRY / REAP (attempts used)--> dead
    blocked / available --CANCEL--> cancelled
    failed / dead / cancelled --REQUEUE--> available
    running --REQUEST_CANCEL--> running, with a cancel request (no state change)
    running with a cancel request --CANCEL_HELD (holder) / REAP (expired)--> cancelled
    (a schedule's tick) --CRON_ENQUEUE--> available, with the row of conveyor_cron advanced

The guard. Every CLAIM issues a new fencing token: `lease_version + 1`, with
`lease_owner` set to the claiming worker. Every later write a worker makes
about a job it holds (HEARTBEAT, COMPLETE, RETRY, FAIL, SNOOZE, RELEASE,
LOCK_FOR_EFFECT) matches the row on `id`, `state = 'running'`, `lease_owner`
*and* `lease_version`. A write that matches zero rows is stale: the lease
was reaped, handed to another worker, or cancelled. Callers treat zero rows
as a return value (log it, count it), never as an exception, except inside
`context.atomic()`, where the handler must stop. Every write that ends a
lease (RETRY, FAIL, SNOOZE, RELEASE, REAP) clears `lease_owner`; only CLAIM
bumps `lease_version`; a COMPLETE row keeps the owner that completed it.

Cancelling a running job is cooperative. REQUEST_CANCEL only records the
request (`cancel_requested_at`, `cancel_requested_by`); HEARTBEAT reports it
to the holder, which stops the handler and writes CANCEL_HELD under its
token, so the handler's own outcome then matches zero rows. From the request
on, LOCK_FOR_EFFECT refuses the job (no effect commits after a cancel), and
a lease that expires instead is reaped to `cancelled`. REQUEUE clears it.

Operators leave a trace: REQUEUE, CANCEL, REQUEST_CANCEL and CANCEL_HELD
append `{"time", "actor", "action", "detail"}` to the job's `history`.

The clock. Leases are compared with the database's `now()`, never a
worker's clock, so clock skew between hosts cannot break them. REAP takes
back leases whose `lease_expires_at < now()`; it skips rows locked by a
worker's guarded transaction, so a handler that holds the row lock in
LOCK_FOR_EFFECT cannot lose the job between its check and its commit.

Invariants (checked by the spec, SPIN, the property tests and fault runs):
at most one worker holds a valid lease on a job; an outcome is written only
by the current token holder; a completed job's effect is in the ledger
exactly once; every job ends in a final state while some worker runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from .exceptions import IdempotencyKeyReused
from .states import JobState

NOTIFY_CHANNEL = "conveyor"
DEFAULT_ACTOR = "code"  # Who changed a job, when the caller does not say.


def _history(action: str, detail: str) -> str:
    """SQL for a one-entry history array; `detail` is an SQL text expression."""
    return (
        "jsonb_build_array(jsonb_build_object('time', now(), 'actor', %(actor)s::text, "
        f"'action', '{action}', 'detail', {detail}))"
    )


_ENQUEUE_COLUMNS = """
    task_path text, args jsonb, kwargs jsonb, queue text, backend text, priority int,
    max_attempts int, run_after timestamptz, idempotency_key text, ord int
"""

ENQUEUE = f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS t({_ENQUEUE_COLUMNS})
), inserted AS (
    INSERT INTO conveyor_job (
        task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts,
        run_after, enqueued_run_after, lease_version, idempotency_key, errors, enqueued_at
    )
    SELECT task_path, args, kwargs, queue, backend, priority, 'available', 0, max_attempts,
           COALESCE(run_after, now()), run_after, 0, idempotency_key, '[]'::jsonb, now()
    FROM input ORDER BY ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, idempotency_key, queue, run_after, enqueued_at
)
SELECT id, idempotency_key, enqueued_at, run_after,
       CASE WHEN %(notify)s AND run_after <= now() THEN pg_notify(%(channel)s, queue) END
FROM inserted
"""

EXISTING_BY_KEY = """
SELECT id, idempotency_key, enqueued_at, run_after, task_path, args, kwargs, queue
FROM conveyor_job
WHERE idempotency_key = ANY(%(keys)s)
"""

CLAIM = """
WITH picked AS (
    SELECT id FROM conveyor_job
    WHERE state = 'available'
      AND queue = ANY(%(queues)s)
      AND run_after <= now()
      AND queue <> ALL(ARRAY(SELECT name FROM conveyor_queue WHERE paused))
    ORDER BY priority DESC, run_after, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_job AS j
SET state = 'running',
    attempt = j.attempt + 1,
    lease_owner = %(owner)s,
    lease_version = j.lease_version + 1,
    lease_expires_at = now() + make_interval(secs => %(lease)s),
    started_at = now()
FROM picked
WHERE j.id = picked.id
RETURNING j.id, j.task_path, j.args, j.kwargs, j.queue, j.backend, j.priority, j.attempt,
          j.max_attempts, j.lease_version, j.idempotency_key, j.enqueued_at, j.started_at,
          j.lease_owner,
          extract(epoch FROM j.started_at - greatest(j.enqueued_at, j.run_after))::float8,
          NULLIF(j.errors, '[]'::jsonb), j.enqueued_run_after
"""

_HELD = "FROM jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint, version bigint"

# SKIP LOCKED: a row locked by the worker's own open context.atomic() must not
# stall the heartbeat of every other lease; the lock itself keeps the reaper off.
# A renewed job with a cancel request is reported, so its holder can stop it.
HEARTBEAT = """
WITH renew AS (
    SELECT j.id
    FROM conveyor_job AS j
    JOIN jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint, version bigint)
      ON j.id = h.id AND j.lease_version = h.version
    WHERE j.state = 'running' AND j.lease_owner = %(owner)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE conveyor_job AS j
SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM renew
WHERE j.id = renew.id
RETURNING j.id, j.cancel_requested_at IS NOT NULL
"""

COMPLETE = f"""
UPDATE conveyor_job AS j
SET state = 'completed', return_value = h.return_value, finished_at = now(),
    lease_expires_at = NULL
{_HELD}, return_value jsonb)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""

RECORD_RESULT = f"""
UPDATE conveyor_job AS j
SET return_value = h.return_value
{_HELD}, return_value jsonb)
WHERE j.id = h.id AND j.state = 'completed'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""

_ERROR_ENTRY = """jsonb_build_array(h.error || jsonb_build_object(
        'attempt', j.attempt, 'worker', j.lease_owner, 'token', j.lease_version,
        'started_at', j.started_at, 'time', now()))"""

RETRY = f"""
UPDATE conveyor_job AS j
SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
    run_after = now() + make_interval(secs => h.delay),
    finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
    errors = j.errors || {_ERROR_ENTRY},
    lease_owner = NULL, lease_expires_at = NULL
{_HELD}, delay float8, error jsonb)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id, j.state
"""

FAIL = f"""
UPDATE conveyor_job AS j
SET state = 'failed', finished_at = now(), errors = j.errors || {_ERROR_ENTRY},
    lease_owner = NULL, lease_expires_at = NULL
{_HELD}, error jsonb)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""

SNOOZE = f"""
UPDATE conveyor_job AS j
SET state = 'available', attempt = j.attempt - 1,
    run_after = now() + make_interval(secs => h.delay), lease_owner = NULL, lease_expires_at = NULL
{_HELD}, delay float8)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""

RELEASE = f"""
UPDATE conveyor_job AS j
SET state = 'available', attempt = j.attempt - 1, lease_owner = NULL, lease_expires_at = NULL
{_HELD})
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""

# A cancel request refuses the lock: no effect commits after an operator's cancel.
LOCK_FOR_EFFECT = """
SELECT id FROM conveyor_job
WHERE id = %(id)s AND state = 'running'
  AND lease_owner = %(owner)s AND lease_version = %(version)s
  AND cancel_requested_at IS NULL
FOR UPDATE
"""

REAP = """
WITH expired AS (
    SELECT id, lease_owner FROM conveyor_job
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                         OR j.attempt >= j.max_attempts THEN now() END,
    run_after = now(),
    lease_owner = NULL,
    lease_expires_at = NULL,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'worker', j.lease_owner, 'token', j.lease_version,
        'started_at', j.started_at,
        'exception_class_path', CASE WHEN j.cancel_requested_at IS NOT NULL
            THEN 'django_conveyor.exceptions.Cancelled'
            ELSE 'django_conveyor.exceptions.LeaseLost' END,
        'traceback', 'The lease expired at ' || j.lease_expires_at || CASE
            WHEN j.cancel_requested_at IS NOT NULL
            THEN ' after a cancel request by ' || j.cancel_requested_by
                || '; the reaper cancelled the job.'
            ELSE ' without a heartbeat; the job was taken back by the reaper.' END,
        'time', now()))
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.state, j.task_path, j.queue, j.attempt, expired.lease_owner, j.lease_version
"""

REQUEUE = f"""
UPDATE conveyor_job
SET state = 'available', attempt = 0, run_after = now(), finished_at = NULL,
    lease_expires_at = NULL, return_value = NULL,
    cancel_requested_at = NULL, cancel_requested_by = NULL,
    history = history || {_history("requeue", "'was ' || state")}
WHERE id = ANY(%(ids)s) AND state IN ('failed', 'dead', 'cancelled')
RETURNING id, queue
"""

CANCEL = f"""
UPDATE conveyor_job
SET state = 'cancelled', finished_at = now(),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'attempt', attempt, 'worker', NULL, 'token', lease_version,
        'exception_class_path', 'django_conveyor.exceptions.Cancelled',
        'traceback', 'Cancelled before it ran, by ' || %(actor)s::text || '.', 'time', now())),
    history = history || {_history("cancel", "'was ' || state")}
WHERE id = ANY(%(ids)s) AND state IN ('blocked', 'available')
RETURNING id
"""

# Any token: the operator does not hold the lease. The first request stands.
REQUEST_CANCEL = f"""
UPDATE conveyor_job
SET cancel_requested_at = now(), cancel_requested_by = %(actor)s::text,
    history = history || {
    _history(
        "request_cancel",
        "'running on ' || COALESCE(lease_owner, '?') || ' (token ' || lease_version || ')'",
    )
}
WHERE id = ANY(%(ids)s) AND state = 'running' AND cancel_requested_at IS NULL
RETURNING id
"""

CANCEL_HELD = f"""
UPDATE conveyor_job AS j
SET state = 'cancelled', finished_at = now(),
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'worker', j.lease_owner, 'token', j.lease_version,
        'started_at', j.started_at,
        'exception_class_path', 'django_conveyor.exceptions.Cancelled',
        'traceback', 'Cancelled while running, at the request of '
            || j.cancel_requested_by || '.',
        'time', now())),
    history = j.history || {
    _history("cancel_held", "'stopped while running, as ' || j.cancel_requested_by || ' asked'")
},
    lease_owner = NULL, lease_expires_at = NULL
{_HELD})
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
  AND j.cancel_requested_at IS NOT NULL
RETURNING j.id
"""

PRUNE = """
WITH doomed AS (
    SELECT id FROM conveyor_job
    WHERE state IN ('completed', 'failed', 'dead', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(older_than)s)
      AND queue = ANY(%(queues)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), ledger AS (
    -- The foreign key cascades in Django, not in the database: delete here.
    DELETE FROM conveyor_ledger AS l USING doomed WHERE l.job_id = doomed.id
)
DELETE FROM conveyor_job AS j USING doomed WHERE j.id = doomed.id
"""

NOTIFY = "SELECT pg_notify(%(channel)s, %(queue)s)"

# One tick of a periodic schedule: the job and the schedule's advance commit
# together or not at all. The row guard (enabled, next_tick_at = the tick the
# caller computed from) makes a racing or stale scheduler write nothing; the
# tick's idempotency key makes a second job for the same tick impossible even
# if a row was reset by hand. SKIP LOCKED: a scheduler never waits for another.
CRON_ROW_GUARD = """
WITH due AS (
    SELECT id FROM conveyor_cron
    WHERE id = %(cron_id)s AND enabled AND next_tick_at = %(expected)s
    FOR UPDATE SKIP LOCKED
)"""

CRON_ENQUEUE = f"""{CRON_ROW_GUARD}, inserted AS (
    INSERT INTO conveyor_job (
        task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts,
        run_after, enqueued_run_after, lease_version, idempotency_key, errors, enqueued_at
    )
    SELECT %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(queue)s, %(backend)s,
           %(priority)s, 'available', 0, %(max_attempts)s, %(tick)s, %(tick)s, 0, %(key)s,
           '[]'::jsonb, now()
    FROM due
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, queue, run_after
), advanced AS (
    UPDATE conveyor_cron AS c
    SET last_tick_at = %(tick)s, next_tick_at = %(next_tick)s,
        last_job_id = COALESCE(
            (SELECT id FROM inserted),
            (SELECT id FROM conveyor_job WHERE idempotency_key = %(key)s))
    FROM due
    WHERE c.id = due.id
    RETURNING c.last_job_id
)
SELECT a.last_job_id, i.id IS NOT NULL,
       CASE WHEN %(notify)s AND i.run_after <= now() THEN pg_notify(%(channel)s, i.queue) END
FROM advanced AS a LEFT JOIN inserted AS i ON true
"""


class Cursor(Protocol):
    """What the protocol needs of a cursor: Django's wrapper or psycopg's."""

    rowcount: int

    def execute(self, query: Any, params: Any = ...) -> Any: ...

    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class NewJob:
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    backend: str
    priority: int
    max_attempts: int
    run_after: datetime | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    enqueued_at: datetime
    run_after: datetime
    created: bool  # False when the idempotency key already named a job.


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed job as the worker holds it: the row plus its fencing token.

    The token is (`owner`, `version`): every later write about this attempt is
    guarded by both, and the Lease carries them unchanged from CLAIM to that write.
    """

    id: int
    task_path: str
    args: list[Any]
    kwargs: dict[str, Any]
    queue: str
    backend: str
    priority: int
    attempt: int
    max_attempts: int
    version: int  # The fencing token's version: lease_version after this claim.
    idempotency_key: str | None
    enqueued_at: datetime
    started_at: datetime  # The claim's database time.
    owner: str  # The fencing token's owner: the claiming worker's id.
    pickup_delay: float  # Seconds from when the job was due (enqueued or run_after) to now.
    errors: list[dict[str, Any]] | None  # Entries of earlier attempts; None when none.
    enqueued_run_after: datetime | None  # run_after as enqueued; None: not deferred.


@dataclass(frozen=True, slots=True)
class Reaped:
    id: int
    state: str
    task_path: str
    queue: str
    attempt: int
    owner: str | None
    version: int


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def enqueue(cursor: Cursor, jobs: Sequence[NewJob], *, notify: bool) -> list[Enqueued]:
    """Insert jobs in the caller's transaction; NOTIFY is delivered on commit.

    A job whose idempotency key already exists is not inserted; the existing
    job comes back with `created=False`. A key names one operation: if the
    existing job has another task, other arguments or another queue,
    `IdempotencyKeyReused` is raised. Nothing was written for that job, and
    no statement failed, so the caller's transaction stays usable.
    """
    rows = [
        {
            "task_path": j.task_path,
            "args": j.args,
            "kwargs": j.kwargs,
            "queue": j.queue,
            "backend": j.backend,
            "priority": j.priority,
            "max_attempts": j.max_attempts,
            "run_after": j.run_after.isoformat() if j.run_after else None,
            "idempotency_key": j.idempotency_key,
            "ord": i,
        }
        for i, j in enumerate(jobs)
    ]
    cursor.execute(ENQUEUE, {"rows": _json(rows), "notify": notify, "channel": NOTIFY_CHANNEL})
    inserted = cursor.fetchall()
    by_key = {key: (id_, at, after) for id_, key, at, after, _ in inserted if key is not None}
    unkeyed = iter([(id_, at, after) for id_, key, at, after, _ in inserted if key is None])
    missing = [
        j.idempotency_key for j in jobs if j.idempotency_key and j.idempotency_key not in by_key
    ]
    existing: dict[str, tuple[Any, ...]] = {}
    if missing:
        cursor.execute(EXISTING_BY_KEY, {"keys": missing})
        existing = {row[1]: row for row in cursor.fetchall()}
    results: list[Enqueued] = []
    seen: dict[str, NewJob] = {}
    for job in jobs:
        key = job.idempotency_key
        if key is None:
            id_, at, after = next(unkeyed)
            results.append(Enqueued(id_, at, after, created=True))
        elif key in by_key and key not in seen:
            seen[key] = job
            results.append(Enqueued(*by_key[key], created=True))
        else:
            if key in seen:
                first = seen[key]
                _check_same_operation(key, by_key[key][0], job, first.task_path, first.args,
                                      first.kwargs, first.queue)  # fmt: skip
                id_, at, after = by_key[key]
            else:
                id_, _, at, after, task_path, args, kwargs, queue = existing[key]
                args, kwargs = loaded(args), loaded(kwargs)
                _check_same_operation(key, id_, job, task_path, args, kwargs, queue)
            results.append(Enqueued(id_, at, after, created=False))
    return results


def loaded(value: Any) -> Any:
    """jsonb as Python: Django's cursors hand it over as text, psycopg's decoded."""
    return json.loads(value) if isinstance(value, str) else value


def _check_same_operation(
    key: str, job_id: int, job: NewJob, task_path: str, args: Any, kwargs: Any, queue: str
) -> None:
    differs = [
        name
        for name, mine, theirs in (
            ("task", job.task_path, task_path),
            ("arguments", (job.args, job.kwargs), (args, kwargs)),
            ("queue", job.queue, queue),
        )
        if mine != theirs
    ]
    if differs:
        raise IdempotencyKeyReused(
            f"Idempotency key {key!r} already names job {job_id} ({task_path} on queue "
            f"{queue!r}) that differs in its {' and '.join(differs)}; a key names one "
            "operation, so use a new key for a different call.",
            job_id=job_id,
            key=key,
        )


def claim(
    cursor: Cursor, *, owner: str, queues: Sequence[str], limit: int, lease_seconds: float
) -> list[Lease]:
    """Take up to `limit` ready jobs, each with a new fencing token."""
    cursor.execute(
        CLAIM, {"queues": list(queues), "limit": limit, "owner": owner, "lease": lease_seconds}
    )
    return [Lease(*row) for row in cursor.fetchall()]


class Renewed(set[int]):
    """The ids HEARTBEAT renewed; `cancel_requested` are those an operator asked to stop."""

    def __init__(self, rows: Iterable[tuple[int, bool]] = ()) -> None:
        rows = list(rows)
        super().__init__(id_ for id_, _ in rows)
        self.cancel_requested = frozenset(id_ for id_, requested in rows if requested)


def heartbeat(
    cursor: Cursor, *, owner: str, held: Iterable[tuple[int, int]], lease_seconds: float
) -> Renewed:
    """Renew every lease the worker holds; a job missing from the result is lost.

    The result also says which renewed jobs have a cancel request.
    """
    held = [{"id": id_, "version": version} for id_, version in held]
    if not held:
        return Renewed()
    cursor.execute(HEARTBEAT, {"held": _json(held), "owner": owner, "lease": lease_seconds})
    return Renewed(cursor.fetchall())


def complete(cursor: Cursor, *, owner: str, done: Iterable[tuple[int, int, Any]]) -> set[int]:
    """Mark jobs completed with their return values; returns the ids written."""
    held = [{"id": i, "version": v, "return_value": r} for i, v, r in done]
    return _guarded(cursor, COMPLETE, owner, held)


def record_result(cursor: Cursor, *, owner: str, done: Iterable[tuple[int, int, Any]]) -> set[int]:
    """Store return values of jobs this token already completed in context.atomic()."""
    held = [{"id": i, "version": v, "return_value": r} for i, v, r in done if r is not None]
    return _guarded(cursor, RECORD_RESULT, owner, held)


def retry(
    cursor: Cursor, *, owner: str, failures: Iterable[tuple[int, int, float, dict[str, Any]]]
) -> dict[int, str]:
    """Return failed attempts to `available` after a delay, or `dead` when used up."""
    held = [{"id": i, "version": v, "delay": d, "error": e} for i, v, d, e in failures]
    if not held:
        return {}
    cursor.execute(RETRY, {"held": _json(held), "owner": owner})
    return {id_: state for id_, state in cursor.fetchall()}


def fail(
    cursor: Cursor, *, owner: str, failures: Iterable[tuple[int, int, dict[str, Any]]]
) -> set[int]:
    """Move jobs to `failed` at once (the handler said never retry)."""
    held = [{"id": i, "version": v, "error": e} for i, v, e in failures]
    return _guarded(cursor, FAIL, owner, held)


def snooze(cursor: Cursor, *, owner: str, snoozed: Iterable[tuple[int, int, float]]) -> set[int]:
    """Run jobs again after a delay, giving back the attempt they used."""
    held = [{"id": i, "version": v, "delay": d} for i, v, d in snoozed]
    return _guarded(cursor, SNOOZE, owner, held)


def release(cursor: Cursor, *, owner: str, held: Iterable[tuple[int, int]]) -> set[int]:
    """Hand leases back at once (graceful shutdown); the attempt is not counted."""
    rows = [{"id": i, "version": v} for i, v in held]
    return _guarded(cursor, RELEASE, owner, rows)


def lock_for_effect(cursor: Cursor, *, job_id: int, owner: str, version: int) -> bool:
    """Lock the job row for the caller's transaction if the token still holds it.

    False when the token lost the job or an operator asked to cancel it.
    """
    cursor.execute(LOCK_FOR_EFFECT, {"id": job_id, "owner": owner, "version": version})
    return bool(cursor.fetchall())


def reap(cursor: Cursor, *, limit: int = 500) -> list[Reaped]:
    """Take back expired leases: to `available`, `dead` when attempts are used up,
    or `cancelled` when an operator asked to cancel the job."""
    cursor.execute(REAP, {"limit": limit})
    return [Reaped(*row) for row in cursor.fetchall()]


def requeue(
    cursor: Cursor, *, ids: Sequence[int], notify: bool = True, actor: str = DEFAULT_ACTOR
) -> list[int]:
    """Give failed, dead or cancelled jobs a fresh set of attempts.

    Guard: state failed, dead or cancelled; other ids are left alone and
    missing from the result. Clears a cancel request; notes it in history.
    """
    cursor.execute(REQUEUE, {"ids": list(ids), "actor": actor})
    rows = cursor.fetchall()
    if notify:
        for queue in sorted({queue for _, queue in rows}):
            cursor.execute(NOTIFY, {"channel": NOTIFY_CHANNEL, "queue": queue})
    return [id_ for id_, _ in rows]


def cancel(cursor: Cursor, *, ids: Sequence[int], actor: str = DEFAULT_ACTOR) -> list[int]:
    """Cancel jobs that have not started (blocked or available).

    Guard: state blocked or available; others are missing from the result.
    """
    cursor.execute(CANCEL, {"ids": list(ids), "actor": actor})
    return [row[0] for row in cursor.fetchall()]


def request_cancel(cursor: Cursor, *, ids: Sequence[int], actor: str = DEFAULT_ACTOR) -> list[int]:
    """Ask the workers holding these running jobs to stop them; no state changes.

    Guard: state running and no earlier request; any token. Zero rows means
    the job is not running (any more) or was already asked to stop.
    """
    cursor.execute(REQUEST_CANCEL, {"ids": list(ids), "actor": actor})
    return [row[0] for row in cursor.fetchall()]


def cancel_held(
    cursor: Cursor, *, owner: str, held: Iterable[tuple[int, int]], actor: str = DEFAULT_ACTOR
) -> set[int]:
    """The holder honours cancel requests: its jobs become `cancelled`.

    Guard: state running, owner and version (the token), and a cancel
    request. Zero rows means the lease was lost, or there was no request.
    """
    rows = [{"id": i, "version": v} for i, v in held]
    if not rows:
        return set()
    cursor.execute(CANCEL_HELD, {"held": _json(rows), "owner": owner, "actor": actor})
    return {row[0] for row in cursor.fetchall()}


def prune(cursor: Cursor, *, older_than_seconds: float, queues: Sequence[str], limit: int) -> int:
    """Delete up to `limit` finished jobs older than the retention window."""
    cursor.execute(
        PRUNE, {"older_than": older_than_seconds, "queues": list(queues), "limit": limit}
    )
    return cursor.rowcount


@dataclass(frozen=True, slots=True)
class CronTick:
    job_id: int | None  # The tick's job: new, or the one its key already named.
    created: bool  # False when the tick's key already named a job.


def cron_key(name: str, tick: datetime) -> str:
    """The idempotency key of one tick: `cron:<schedule name>:<tick in UTC, ISO 8601>`."""
    return f"cron:{name}:{tick.astimezone(UTC).replace(tzinfo=None).isoformat()}Z"


def cron_enqueue(
    cursor: Cursor,
    *,
    cron_id: int,
    name: str,
    expected: datetime,
    tick: datetime,
    next_tick: datetime | None,
    job: NewJob,
    notify: bool,
) -> CronTick | None:
    """Enqueue the job of one tick and advance its schedule, in one statement.

    Guard: the schedule is enabled, its `next_tick_at` is still `expected`
    (the tick this pass computed from) and no other scheduler holds its row.
    The job gets the key `cron_key(name, tick)` and `run_after = tick`; the
    row gets `last_tick_at = tick`, `next_tick_at = next_tick` and the job's
    id. Zero rows (None) means another scheduler advanced the row or is
    doing so now, or it was disabled or changed: nothing was written.
    """
    cursor.execute(
        CRON_ENQUEUE,
        {
            "cron_id": cron_id,
            "expected": expected,
            "tick": tick,
            "next_tick": next_tick,
            "task_path": job.task_path,
            "args": _json(job.args),
            "kwargs": _json(job.kwargs),
            "queue": job.queue,
            "backend": job.backend,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "key": cron_key(name, tick),
            "notify": notify,
            "channel": NOTIFY_CHANNEL,
        },
    )
    rows = cursor.fetchall()
    return CronTick(rows[0][0], bool(rows[0][1])) if rows else None


def _guarded(cursor: Cursor, sql: str, owner: str, held: list[dict[str, Any]]) -> set[int]:
    if not held:
        return set()
    cursor.execute(sql, {"held": _json(held), "owner": owner})
    return {row[0] for row in cursor.fetchall()}


ACTIONS = {
    "ENQUEUE": enqueue,
    "CLAIM": claim,
    "HEARTBEAT": heartbeat,
    "COMPLETE": complete,
    "RECORD_RESULT": record_result,
    "RETRY": retry,
    "FAIL": fail,
    "SNOOZE": snooze,
    "RELEASE": release,
    "LOCK_FOR_EFFECT": lock_for_effect,
    "REAP": reap,
    "REQUEUE": requeue,
    "CANCEL": cancel,
    "REQUEST_CANCEL": request_cancel,
    "CANCEL_HELD": cancel_held,
    "CRON_ENQUEUE": cron_enqueue,
}

__all__ = ["ACTIONS", "JobState", "Lease", "NewJob", "Reaped", "Renewed"]
