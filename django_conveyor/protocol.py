"""The lease protocol: every statement that changes a job's state.

Read this module against `spec/tla/Conveyor.tla`: each SQL constant is named
after the spec action it implements, and nothing else in the package writes
`conveyor_job`.

States and the only transitions (DESIGN §3)::

    (enqueue with unfinished dependencies) --ENQUEUE--> blocked
    blocked --UNBLOCK (with the COMPLETE of its last dependency)--> available
    blocked --CANCEL_DEPENDENTS (with a dependency's FAIL / dead / CANCEL)--> cancelled
    cancelled by a dependency --REBLOCK_DEPENDENTS (with that REQUEUE)--> blocked
    available, policy 'run', not claimed --REBLOCK_DEPENDENTS (a dependency requeued)--> blocked
    available --CLAIM--> running --COMPLETE--> completed
    available, isolated --CLAIM_ISOLATED--> running (one per worker, alone)
    available <--RETRY / SNOOZE / RELEASE / REAP-- running
    running --FAIL--> failed      running --RETRY / REAP (attempts used)--> dead
    blocked / available --CANCEL--> cancelled
    failed / dead / cancelled --REQUEUE--> available (blocked with dependencies)
    running --REQUEST_CANCEL--> running, with a cancel request (no state change)
    running with a cancel request --CANCEL_HELD (holder, also after its COMPLETE is refused)
        / REAP (expired) / RETRY, SNOOZE, RELEASE--> cancelled
    (a schedule's tick) --CRON_ENQUEUE--> available, with the row of conveyor_cron advanced
    blocked gate that waits --SIGNAL / CONDITION_MET / GATE_TIMEOUT--> completed or failed
    running --CHECKPOINT--> running, with a step's record in conveyor_ledger (no state change)

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
so do COMPLETE and RECORD_RESULT: a handler that returned before its
worker's heartbeat told it has its COMPLETE refused, and the holder writes
CANCEL_HELD in the same transaction; RETRY, SNOOZE and RELEASE hand the job
back as `cancelled`; a lease that expires instead is reaped to `cancelled`.
A job with a cancel request therefore never ends completed, and its
dependents are settled as for a cancel. REQUEUE clears the request.

Crash containment. A job whose lease expired may have killed its worker,
and the jobs claimed with it died too. So REAP marks a job it returns to
`available` as `isolated`: CLAIM never takes it again; CLAIM_ISOLATED
takes it, one at a time, for a worker that holds no other isolated job
(and, on the worker's side, no claimed job that has not started). The mark
stays until an outcome of its handler is written (COMPLETE, RETRY, FAIL,
SNOOZE, CANCEL_HELD clear it); RELEASE keeps it; REQUEUE clears it. A
crasher thus dies alone after its first crash, and ends `dead` with its
own attempts, while the jobs reaped with it complete.

Workflows. A job with dependencies (`conveyor_dependency`) is `blocked`
while `pending_dependencies`, the count of dependencies not yet satisfied,
is above 0; it is decremented, never recounted, in the transaction that
satisfies one (O(1) per completed dependency). UNBLOCK's update is part
of COMPLETE's statement, for the ids the fenced COMPLETE really wrote, so a
refused (zombie) completion unblocks nothing. CANCEL_DEPENDENTS runs inside every
function that makes a job failed, dead or cancelled (`retry`, `fail`,
`reap`, `cancel`, `cancel_held`): a blocked dependent with policy
`cancel` becomes `cancelled` with a `DependencyFailed` error naming the
dependency, and so on down the graph; one with policy `run` is
decremented. `requeue()` runs REBLOCK_DEPENDENTS: the dependents that a
dependency's failure cancelled return to `blocked`, transitively, their
counters recomputed under share locks on their dependencies. Lock order is
always a dependency before its dependents.

Gates. A job with a `gate` definition is a workflow step no handler
runs. Every statement that would make a job available (ENQUEUE, UNBLOCK,
CANCEL_DEPENDENTS, REBLOCK_DEPENDENTS, REQUEUE) keeps a gate `blocked`, and
sets its `gate_deadline` when its upstream is satisfied: it then waits
(blocked, pending_dependencies = 0). CLAIM reads only available rows, so it
never takes a gate. SIGNAL, CONDITION_MET and GATE_TIMEOUT end the wait,
each guarded by "still waits" under the gate's row lock, so the first one
wins and a gate ends once; its dependents follow in the same transaction.
CHECKPOINT records a resumable step under the fence, inside the attempt's
guarded transaction (after LOCK_FOR_EFFECT), once per (job, step).

Operators leave a trace: REQUEUE, CANCEL, REQUEST_CANCEL and CANCEL_HELD
append `{"time", "actor", "action", "detail"}` to the job's `history`; so
does a SNOOZE whose delay the worker capped at ten years (no state changes
beyond SNOOZE's own).

The clock. Leases are compared with the database's `now()`, never a
worker's clock, so clock skew between hosts cannot break them. REAP takes
back leases whose `lease_expires_at < now()`; it skips rows locked by a
worker's guarded transaction, so a handler that holds the row lock in
LOCK_FOR_EFFECT cannot lose the job between its check and its commit. That
lock must not outlive a worker that stopped: BOUND_TRANSACTION, the first
statement of the guarded transaction, makes PostgreSQL end it when a
statement runs, or the session sits idle, for longer than one lease.

Invariants (checked by the spec, SPIN, the property tests and fault runs):
at most one worker holds a valid lease on a job; an outcome is written only
by the current token holder; a completed job's effect is in the ledger
exactly once; every job ends in a final state while some worker runs.

The module reads by action family: enqueue, claim, outcomes (what the
holder of a lease writes), maintenance (reap, prune), operators (requeue,
cancel), workflows (unblock, cancel and reblock dependents), gates (signal,
condition met, gate timeout, checkpoint) and cron. Each
SQL constant sits directly above the function that runs it; `ACTIONS`, at
the end, names them for `tests/test_spec_names.py`.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol

from psycopg import pq

from .exceptions import (
    DependencyAlreadyFailed,
    DependencyNotFound,
    IdempotencyKeyReused,
    TooManyDependencies,
    UniqueKeyContended,
)
from .readable import Unreadable, fetch_all, loads_or_unreadable
from .serialization import loaded
from .states import JobState
from .unique import Entry, UniqueCall, fold

NOTIFY_CHANNEL = "conveyor"
DEFAULT_ACTOR = "code"  # Who changed a job, when the caller does not say.
MAX_DEPENDENCIES = 10_000  # Per job: one fan-in callback after a 10,000-job group.
UNSUCCESSFUL_STATES = ("failed", "dead", "cancelled")  # Final, but not completed.


class Cursor(Protocol):
    """What the protocol needs of a cursor: Django's wrapper or psycopg's."""

    rowcount: int

    def execute(self, query: Any, params: Any = ...) -> Any: ...

    def fetchall(self) -> list[Any]: ...


# Compact JSON for parameters. One encoder for every call: json.dumps with
# separators builds a new JSONEncoder each time.
_json = json.JSONEncoder(separators=(",", ":")).encode


def _error_entry(entry: str, *, ran: bool = True) -> str:
    """SQL for a one-entry array to append to a job's `errors`: the one builder of an entry.

    `entry` is a jsonb expression with what this end says (the exception's
    class path, its traceback, maybe more); every entry adds the attempt and
    its token, and the time. `ran`: the attempt ran under a lease, so the
    entry names its worker and when it started; a job that ends without
    running (a cancel, a failed dependency) names no worker.
    """
    worker, started = ("j.lease_owner", "'started_at', j.started_at, ") if ran else ("NULL", "")
    return (
        f"jsonb_build_array({entry} || jsonb_build_object('attempt', j.attempt, "
        f"'worker', {worker}, 'token', j.lease_version, {started}'time', now()))"
    )


def _history(action: str, detail: str) -> str:
    """SQL for a one-entry history array; `detail` is an SQL text expression."""
    return (
        "jsonb_build_array(jsonb_build_object('time', now(), 'actor', %(actor)s::text, "
        f"'action', '{action}', 'detail', {detail}))"
    )


# A gate (the Gates family below) is kept blocked by every statement that
# would make a job available, and its deadline is set when its last upstream
# step is satisfied (it then waits): a timer's `until`, else now() plus its
# `seconds` (a timer's duration, a timeout), else NULL. `row` is the table alias.
def _gate_deadline(row: str) -> str:
    return (
        f"COALESCE(({row}.gate ->> 'until')::timestamptz, "
        f"now() + make_interval(secs => ({row}.gate ->> 'seconds')::float8))"
    )


def _waits_or_runs(row: str, unsatisfied: str) -> str:
    """The state of a job whose dependencies are counted: blocked while `unsatisfied`, or a gate."""
    return f"CASE WHEN {unsatisfied} OR {row}.gate IS NOT NULL THEN 'blocked' ELSE 'available' END"


def _armed_deadline(row: str, satisfied: str, otherwise: str) -> str:
    """A gate's deadline once `satisfied` (its upstream done), else `otherwise`."""
    return (
        f"CASE WHEN {row}.gate IS NOT NULL AND {satisfied} THEN {_gate_deadline(row)} "
        f"ELSE {otherwise} END"
    )


def _dependents_of(ids: str) -> str:
    """The `hits` and `locked` CTEs: the blocked dependents of the jobs `ids` (SQL that
    gives ids: a parameter, or a CTE of the same statement).

    Dependents are locked in id order (two batches completing dependencies of
    the same jobs never deadlock) and re-checked as blocked under the lock.
    """
    return f"""hits AS (
    SELECT d.job_id, count(*) AS n, min(d.depends_on_id) AS first
    FROM conveyor_dependency AS d
    WHERE d.depends_on_id {ids}
    GROUP BY d.job_id
), locked AS (
    SELECT j.id, hits.n, hits.first
    FROM conveyor_job AS j JOIN hits ON j.id = hits.job_id
    WHERE j.state = 'blocked'
    ORDER BY j.id
    FOR UPDATE OF j
)"""


_NOTIFY_AVAILABLE = """CASE WHEN %(notify)s AND j.state = 'available' AND j.run_after <= now()
            THEN pg_notify(%(channel)s, j.queue) END"""


def _unblocked() -> str:
    """UNBLOCK's update of the `locked` dependents: a fragment that UNBLOCK and
    COMPLETE both end with (the actions are theirs)."""
    return f"""UPDATE conveyor_job AS j
SET pending_dependencies = j.pending_dependencies - locked.n,
    state = {_waits_or_runs("j", "j.pending_dependencies - locked.n > 0")},
    run_after = CASE WHEN j.pending_dependencies - locked.n > 0 THEN j.run_after
                     ELSE greatest(j.run_after, now()) END,
    gate_deadline = {_armed_deadline("j", "j.pending_dependencies - locked.n <= 0", "NULL")}
FROM locked
WHERE j.id = locked.id
RETURNING j.id, j.state, {_NOTIFY_AVAILABLE}"""


# -- Enqueue: new jobs, in the caller's transaction ------------------------------------------------


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
    depends_on: tuple[int, ...] = ()  # Job ids in the same database, already enqueued.
    dependency_policy: str = "cancel"  # Or "run": run once every dependency is final.
    gate: dict[str, Any] | None = None  # A gate's definition (workflows/gates.py); None: a job.
    # Observability: None when the job has none (NULL, no index entry).
    tags: Sequence[str] | None = None
    meta: dict[str, Any] | None = None
    unique: UniqueCall | None = None  # Unique jobs: the call's key (unique.py).
    concurrency_key: str | None = None  # Flow control: None when the job has none.


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    enqueued_at: datetime
    run_after: datetime
    created: bool  # False when an idempotency key or a unique key named an existing job.
    state: str = JobState.AVAILABLE  # blocked when it waits for dependencies.
    replaced: bool = False  # This call's arguments and run_after went into that job.
    row: dict[str, Any] | None = None  # That job's columns (JOB_COLUMNS), when not created.


# ENQUEUE's input: one typed array per column, element i of each for row i,
# for one job as for thousands. Each element is read by its own type's input
# function; a JSON document of rows had to be parsed whole, then cut into
# rows and converted again (jsonb_to_recordset), which cost more per job and
# more again per call. The JSON columns travel as text (one dump per value).
ENQUEUE_INPUT = (
    ("task_path", "text"), ("args", "jsonb"), ("kwargs", "jsonb"), ("queue", "text"),
    ("backend", "text"), ("priority", "int"), ("max_attempts", "int"),
    ("run_after", "timestamptz"), ("idempotency_key", "text"), ("pending", "int"),
    ("policy", "text"),
    ("gate", "jsonb"),
    ("tags", "jsonb"), ("meta", "jsonb"),
    ("unique_key", "text"), ("unique_period", "float8"), ("unique_states", "jsonb"),
    ("uniqueness", "jsonb"),
    ("concurrency_key", "text"),
)  # fmt: skip


def _unnest(columns: Sequence[tuple[str, str]], alias: str, *, ordinality: str) -> str:
    """SQL for rows read from one array parameter per column (named after it),
    numbered from 1 in the column `ordinality`."""
    arrays = ", ".join(f"%({name})s::{kind}[]" for name, kind in columns)
    names = ", ".join([name for name, _ in columns] + [ordinality])
    return f"unnest({arrays}) WITH ORDINALITY AS {alias}({names})"


def _window(period: str) -> str:
    """SQL for the start of a call's period bucket: the database's now(), rounded
    down to a multiple of the period since the epoch; NULL without a period."""
    return (
        f"CASE WHEN {period} IS NOT NULL THEN "
        f"to_timestamp(floor(extract(epoch FROM now())::float8 / {period}) * {period}) END"
    )


# What ENQUEUE writes into each column, from its input row `input`.
_ENQUEUED_COLUMNS = """task_path, args, kwargs, queue, backend, priority, state, attempt,
    max_attempts, run_after, enqueued_run_after, lease_version, idempotency_key, errors,
    enqueued_at, pending_dependencies, dependency_policy,
    gate, gate_deadline,
    tags, meta,
    unique_key, unique_window, unique_states, uniqueness, concurrency_key"""
_ENQUEUED_VALUES = f"""input.task_path, input.args, input.kwargs, input.queue, input.backend,
       input.priority, {_waits_or_runs("input", "input.pending > 0")}, 0, input.max_attempts,
       COALESCE(input.run_after, now()), input.run_after, 0, input.idempotency_key,
       '[]'::jsonb, now(), input.pending, input.policy,
       input.gate, {_armed_deadline("input", "input.pending = 0", "NULL")},
       input.tags, input.meta,
       input.unique_key, {_window("input.unique_period")}, input.unique_states,
       input.uniqueness, input.concurrency_key"""
_ENQUEUED_RETURNING = """RETURNING id, idempotency_key, enqueued_at, run_after, state, unique_key,
    CASE WHEN %(notify)s AND state = 'available' AND run_after <= now()
         THEN pg_notify(%(channel)s, queue) END"""

# No conflict target: the idempotency key's index and the unique key's are
# both arbiters, so neither can raise into the caller's transaction. A row
# either refuses is not inserted (a job with neither key never is: its
# primary key comes from the sequence). Rows go in in the order of the
# arrays (`ord`, their ordinality, which the function scan already yields in
# order: no sort). One INSERT with no CTE around it: PostgreSQL plans this
# statement on every call (Django binds parameters on the client), and the
# nested form took about half again as long to plan.
ENQUEUE = f"""
INSERT INTO conveyor_job ({_ENQUEUED_COLUMNS})
SELECT {_ENQUEUED_VALUES}
FROM {_unnest(ENQUEUE_INPUT, "input", ordinality="ord")}
ORDER BY ord
ON CONFLICT DO NOTHING
{_ENQUEUED_RETURNING}
"""

_ENQUEUE_KINDS = dict(ENQUEUE_INPUT)

# ENQUEUE for one job: the same statement with its one input row as one
# parameter per column, in a VALUES list. PostgreSQL plans a single-row
# VALUES insert in about half the time of a SELECT from a function scan,
# and a call of task.enqueue() is planned every time (client-side binding):
# the whole call got about 1.3x faster. Generated from ENQUEUE's own
# column values, so the two forms cannot differ in what they write.
_ONE_ROW = re.compile(r"\binput\.(\w+)")
ENQUEUE_ONE = f"""
INSERT INTO conveyor_job ({_ENQUEUED_COLUMNS})
VALUES ({_ONE_ROW.sub(lambda m: f"%({m[1]})s::{_ENQUEUE_KINDS[m[1]]}", _ENQUEUED_VALUES)})
ON CONFLICT DO NOTHING
{_ENQUEUED_RETURNING}
"""

# What an existing job's result is built from (results.result_from_job).
JOB_COLUMNS = (
    "id", "task_path", "args", "kwargs", "queue", "backend", "priority", "state", "run_after",
    "enqueued_run_after", "errors", "return_value", "enqueued_at", "started_at", "finished_at",
    "lease_owner", "tags", "meta", "progress",
)  # fmt: skip
_JOB_COLUMNS = ", ".join(f"j.{column}" for column in JOB_COLUMNS)

# The unique index's key and predicate, verbatim (models.py), so that a
# query's WHERE implies the predicate and reads conveyor_job_unique_key_uniq.
_NO_WINDOW = "'1970-01-01T00:00:00+00:00'::timestamptz"
_HOLDS_KEY = "{j}.unique_states ? {j}.state::text"


def _holds_key_of(j: str, i: str) -> str:
    """SQL: job `j` holds the key of input row `i` (its key, window and states)."""
    return f"""{j}.unique_key = {i}.unique_key
          AND COALESCE({j}.unique_window, {_NO_WINDOW})
              = COALESCE({_window(i + ".unique_period")}, {_NO_WINDOW})
          AND {_HOLDS_KEY.format(j=j)}"""


# The calls ENQUEUE did not insert: the job with the call's idempotency key,
# else the job holding its unique key. A statement of its own, after the
# INSERT: a holder that committed while the INSERT waited for it is visible.
ENQUEUED_JOBS = f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
        AS t(ord int, idempotency_key text, unique_key text, unique_period float8)
)
SELECT i.ord, found.*
FROM input AS i
CROSS JOIN LATERAL (
    SELECT * FROM (
        SELECT true AS by_idempotency_key, {_JOB_COLUMNS} FROM conveyor_job AS j
        WHERE j.idempotency_key = i.idempotency_key
        UNION ALL
        SELECT false, {_JOB_COLUMNS} FROM conveyor_job AS j WHERE {_holds_key_of("j", "i")}
    ) AS candidates
    ORDER BY by_idempotency_key DESC
    LIMIT 1
) AS found
"""

# Debounce (on_duplicate = 'replace'). Each call's holder is found through the
# unique index and written by primary key; the guard (not started, still
# holding the key) is evaluated again on the row's latest version under its
# lock, so a CLAIM that committed first wins and the job is left alone. The
# lock lasts until the caller commits, and CLAIM skips the row (SKIP LOCKED)
# until then, so no worker runs the job with arguments not yet committed.
ENQUEUE_REPLACE = f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
        AS t(ord int, unique_key text, unique_period float8, args jsonb, kwargs jsonb,
             run_after timestamptz, calls int)
), holders AS (
    SELECT i.*, h.id
    FROM input AS i
    CROSS JOIN LATERAL (
        SELECT j.id FROM conveyor_job AS j
        WHERE {_holds_key_of("j", "i")} AND j.state IN ('blocked', 'available')
        LIMIT 1
    ) AS h
)
UPDATE conveyor_job AS j
SET args = h.args, kwargs = h.kwargs, run_after = COALESCE(h.run_after, now()),
    enqueued_run_after = h.run_after,
    uniqueness = j.uniqueness || jsonb_build_object(
        'replaced', COALESCE((j.uniqueness ->> 'replaced')::int, 0) + h.calls,
        'replaced_at', now())
FROM holders AS h
WHERE j.id = h.id AND j.state IN ('blocked', 'available') AND {_HOLDS_KEY.format(j="j")}
RETURNING h.ord, {_JOB_COLUMNS},
    CASE WHEN %(notify)s AND j.state = 'available' AND j.run_after <= now()
         THEN pg_notify(%(channel)s, j.queue) END
"""

MAX_ENQUEUE_PASSES = 20  # Over the calls of one round whose key holder keeps changing.


def enqueue(cursor: Cursor, jobs: Sequence[NewJob], *, notify: bool) -> list[Enqueued]:
    """Insert jobs in the caller's transaction; NOTIFY is delivered on commit.

    A job whose idempotency key already exists is not inserted; the existing
    job comes back with `created=False`. A key names one operation: if the
    existing job has another task, other arguments or another queue,
    `IdempotencyKeyReused` is raised. Nothing was written for that job, and
    no statement failed, so the caller's transaction stays usable.

    Unique jobs: a call whose unique key another job holds (in that job's
    blocking states) is not inserted either; it returns that job, and with
    on_duplicate="replace" a holder that has not started takes the call's
    arguments and run_after (ENQUEUE_REPLACE). The idempotency key is
    checked first. The calls of a batch are answered as if made one after
    another (unique.fold), with one statement of each kind per pass, none
    per call. A call whose holder left its states between two statements is
    inserted again.

    Dependencies are read and share-locked first (LOCK_DEPENDENCIES); a job
    with unsatisfied ones is inserted `blocked` with their count, and its
    edges are written in the same transaction. Refused before anything is
    written: an id that names no job (`DependencyNotFound`), a dependency
    already failed, dead or cancelled under policy `cancel`
    (`DependencyAlreadyFailed`), more than MAX_DEPENDENCIES
    (`TooManyDependencies`).
    """
    pending = pending_dependencies(cursor, jobs)
    if not any(job.unique or job.idempotency_key for job in jobs):
        # No key can refuse a row: one statement, each call its own job, as ever.
        rows = [_row(job, job, pending[i]) for i, job in enumerate(jobs)]
        _execute_enqueue(cursor, rows, notify)
        ordered = _inserted(cursor.fetchall())
    else:
        results: dict[int, Enqueued] = {}
        for entries in fold([(job.idempotency_key, job.unique) for job in jobs]):
            for entry, outcome in _resolve(cursor, jobs, pending, entries, notify).items():
                _answer(jobs, entry, outcome, results)
        ordered = [results[i] for i in range(len(jobs))]
    _add_edges(cursor, jobs, ordered)
    return ordered


# Jobs per ENQUEUE statement of a batch sent in a pipeline (enqueue_pieces).
ENQUEUE_PIECE = 1000


def is_plain(job: NewJob) -> bool:
    """No key can refuse this job's row and it waits for no other job: ENQUEUE
    writes it in one pass, whatever else its statement holds."""
    return job.unique is None and job.idempotency_key is None and not job.depends_on


def is_skipping(job: NewJob) -> bool:
    """Only its unique key can refuse this job's row, and a later call of the key
    changes nothing in it (on_duplicate="skip", no idempotency key, no
    dependencies): the first call of each key can be written as it comes."""
    return (
        job.unique is not None
        and not job.unique.replace
        and job.idempotency_key is None
        and not job.depends_on
    )


def enqueue_pieces(
    connection: Any,
    new_cursor: Callable[[], Any],
    pieces: Iterable[Sequence[NewJob]],
    *,
    notify: bool,
) -> list[Enqueued]:
    """ENQUEUE for plain jobs (`is_plain`), one statement per piece, all sent in one
    pipeline of `connection` (psycopg's): PostgreSQL inserts a piece while
    the caller's generator builds the next, instead of the two taking turns.

    The rows go in in order, as one statement would write them. The caller
    holds the transaction that makes the pieces all or nothing; an exception
    from `pieces` or from a statement leaves the pipeline and rolls that back.
    """

    def rows() -> Iterator[list[tuple[Any, ...]]]:
        for piece in pieces:
            if not all(map(is_plain, piece)):  # Its rows would skip their keys or edges.
                raise ValueError("enqueue_pieces() takes plain jobs only (is_plain).")
            if piece:
                yield [_row(job, job, 0) for job in piece]

    written = _pipelined(connection, new_cursor, rows(), notify)
    return _inserted([row for piece in written for row in piece])


def enqueue_unique_pieces(
    connection: Any,
    new_cursor: Callable[[], Any],
    pieces: Iterable[Sequence[NewJob]],
    *,
    notify: bool,
) -> list[Enqueued]:
    """`enqueue()` for unique jobs that skip their duplicates (`is_skipping`), with
    the first call of each key written piece by piece as `enqueue_pieces` writes.

    The calls are folded as they come: a call whose key an earlier call of the
    batch has joins that call's entry, as `unique.fold` would put it (without
    idempotency keys or replacers, each key has one entry, in the first
    round). An entry whose row a key in the table refused goes on, after the
    pipeline, through the passes of `enqueue()` (read, insert again if the
    holder has left its states); each call is answered as `enqueue()` answers.
    """
    jobs: list[NewJob] = []
    by_key: dict[str, Entry] = {}
    sent: list[list[Entry]] = []  # The new entries of each statement sent.

    def rows() -> Iterator[list[tuple[Any, ...]]]:
        for piece in pieces:
            if not all(map(is_skipping, piece)):  # Its later calls could change the row.
                raise ValueError("enqueue_unique_pieces() takes skipping unique jobs only.")
            new = []
            for job in piece:
                index, key = len(jobs), job.unique.key  # type: ignore[union-attr]  # is_skipping
                jobs.append(job)
                entry = by_key.get(key)
                if entry is None:
                    entry = by_key[key] = Entry(index, [index], [])
                    new.append(entry)
                else:
                    entry.members.append(index)
            if new:
                sent.append(new)
                yield [_row(jobs[entry.first], jobs[entry.first], 0) for entry in new]

    written = _pipelined(connection, new_cursor, rows(), notify)
    tried: dict[Entry, _Outcome | None] = {}
    for entries, inserted in zip(sent, written, strict=True):
        tried.update(_insert_outcomes(jobs, entries, inserted))
    pending = [0] * len(jobs)
    results: dict[int, Enqueued] = {}
    with new_cursor() as cursor:
        outcomes = _resolve(cursor, jobs, pending, list(by_key.values()), notify, tried=tried)
    for entry, outcome in outcomes.items():
        _answer(jobs, entry, outcome, results)
    return [results[i] for i in range(len(jobs))]


def _pipelined(
    connection: Any,
    new_cursor: Callable[[], Any],
    pieces: Iterable[list[tuple[Any, ...]]],
    notify: bool,
) -> list[list[tuple[Any, ...]]]:
    """One ENQUEUE per piece of rows, each sent as soon as it is built, in one
    pipeline; what each returned, in order."""
    sent: list[Any] = []
    try:
        with connection.pipeline():
            for rows in pieces:
                cursor = new_cursor()
                sent.append(cursor)
                _execute_enqueue(cursor, rows, notify)
        return [cursor.fetchall() for cursor in sent]
    finally:
        for cursor in sent:
            cursor.close()


def _inserted(rows: list[tuple[Any, ...]]) -> list[Enqueued]:
    """The jobs an ENQUEUE whose rows no key could refuse inserted, from the rows it
    returned, in their order."""
    return [Enqueued(r[0], r[2], r[3], created=True, state=r[4]) for r in rows]


class _Outcome(NamedTuple):
    """What became of an entry's first call: its job, written now or found."""

    enqueued: Enqueued  # As the first call gets it.
    wrote: bool  # The entry's arguments are in the job (inserted or replaced).
    by_idempotency_key: bool = False  # Found by the first call's idempotency key.


def _resolve(
    cursor: Cursor,
    jobs: Sequence[NewJob],
    pending: list[int],
    entries: list[Entry],
    notify: bool,
    *,
    tried: dict[Entry, _Outcome | None] | None = None,
) -> dict[Entry, _Outcome]:
    """Take one round's entries through ENQUEUE, ENQUEUE_REPLACE and the read of
    ENQUEUED_JOBS, pass after pass, until each has an outcome. `tried`: the
    first pass's ENQUEUE ran already (enqueue_unique_pieces), with these outcomes."""
    outcomes: dict[Entry, _Outcome] = {}
    to_insert, to_replace = list(entries), []
    for _ in range(MAX_ENQUEUE_PASSES):
        to_read: list[Entry] = []
        if tried is None:
            tried = _insert(cursor, jobs, pending, to_insert, notify)
        for entry, outcome in tried.items():
            if outcome is not None:
                outcomes[entry] = outcome
            elif jobs[entry.first].idempotency_key is None and entry.replacers:
                to_replace.append(entry)  # Only its unique key can have refused it.
            else:
                to_read.append(entry)
        replaced = enqueue_replace(cursor, jobs, to_replace, notify)
        outcomes.update(replaced)
        to_read += [entry for entry in to_replace if entry not in replaced]
        to_insert, to_replace, tried = [], [], None
        for entry, (by_idempotency_key, row) in _read(cursor, jobs, to_read).items():
            if row is None:
                to_insert.append(entry)  # The holder left its states: the key is free.
            elif not by_idempotency_key and entry.replacers and row["state"] in PENDING_STATES:
                to_replace.append(entry)  # A newer holder that has not started.
            else:
                outcomes[entry] = _Outcome(_found(row), False, by_idempotency_key)
        if not to_insert and not to_replace:
            return outcomes
    raise UniqueKeyContended(
        f"The jobs holding the unique keys of {len(to_insert) + len(to_replace)} call(s) "
        f"changed state {MAX_ENQUEUE_PASSES} times while they were enqueued; nothing was "
        "decided for them. Enqueue them again."
    )


PENDING_STATES = ("blocked", "available")  # Not started: what ENQUEUE_REPLACE may write.


def _insert(
    cursor: Cursor, jobs: Sequence[NewJob], pending: list[int], entries: list[Entry], notify: bool
) -> dict[Entry, _Outcome | None]:
    """ENQUEUE for these entries: each one's outcome, None where a key refused its row."""
    if not entries:
        return {}
    entries = sorted(entries, key=lambda entry: entry.first)  # Rows go in in call order.
    rows = []
    for entry in entries:
        job, source = jobs[entry.first], jobs[entry.arguments_of(inserting=True)]
        replaced = len([i for i in entry.replacers if i != entry.first])
        rows.append(_row(job, source, pending[entry.first], replaced))
    _execute_enqueue(cursor, rows, notify)
    return _insert_outcomes(jobs, entries, cursor.fetchall())


def _insert_outcomes(
    jobs: Sequence[NewJob], entries: list[Entry], inserted: list[tuple[Any, ...]]
) -> dict[Entry, _Outcome | None]:
    """What ENQUEUE's rows, sent for `entries` in their order, made of each entry."""
    # By their keys (one entry per key in a round), the others in order.
    by_key = {(row[1], row[5]): row for row in inserted if row[1] or row[5]}
    unkeyed = iter([row for row in inserted if not (row[1] or row[5])])
    outcomes: dict[Entry, _Outcome | None] = {}
    for entry in entries:
        job = jobs[entry.first]
        key = (job.idempotency_key, job.unique.key if job.unique else None)
        row = next(unkeyed) if key == (None, None) else by_key.get(key)
        if row is None:
            outcomes[entry] = None
            continue
        written = None
        if len(entry.members) > 1:  # The later calls get the job as written, without a read.
            written = _written(job, jobs[entry.arguments_of(inserting=True)], row)
        outcomes[entry] = _Outcome(
            Enqueued(row[0], row[2], row[3], created=True, state=row[4], row=written), True
        )
    return outcomes


def _row(job: NewJob, source: NewJob, pending: int, replaced: int = 0) -> tuple[Any, ...]:
    """A row of ENQUEUE's input (ENQUEUE_INPUT's order): the job, with `source`'s
    arguments and run_after; with its unique key, the count of later calls that
    `replaced` its arguments before it was written."""
    unique = job.unique
    info = states = None
    if unique is not None:
        if replaced:
            info = _json({**unique.info, "replaced": replaced})
        else:
            info = unique.info_json or _json(unique.info)
        states = unique.states_json or _json(list(unique.states))
    return (
        job.task_path,
        _json(source.args) if source.args else "[]",
        _json(source.kwargs) if source.kwargs else "{}",
        job.queue,
        job.backend,
        job.priority,
        job.max_attempts,
        source.run_after.isoformat() if source.run_after else None,
        job.idempotency_key,
        pending,
        job.dependency_policy,
        None if job.gate is None else _json(job.gate),
        _json(list(job.tags)) if job.tags else None,
        _json(job.meta) if job.meta else None,
        None if unique is None else unique.key,
        None if unique is None else unique.period,
        states,
        info,
        job.concurrency_key,
    )


_ENQUEUE_NUMBERS = frozenset(name for name, kind in ENQUEUE_INPUT if kind in ("int", "float8"))


def _execute_enqueue(cursor: Cursor, rows: list[tuple[Any, ...]], notify: bool) -> None:
    """ENQUEUE for these rows (ENQUEUE_ONE for one); the caller fetches what it returns."""
    if len(rows) == 1:
        params = dict(zip(_ENQUEUE_KINDS, rows[0], strict=True))
        cursor.execute(ENQUEUE_ONE, {**params, "notify": notify, "channel": NOTIFY_CHANNEL})
    else:
        cursor.execute(ENQUEUE, _enqueue_params(rows, notify))


def _enqueue_params(rows: list[tuple[Any, ...]], notify: bool) -> dict[str, Any]:
    """ENQUEUE's parameters: its rows as one array per column, and the NOTIFY switch."""
    columns = list(zip(*rows, strict=True)) or [()] * len(ENQUEUE_INPUT)  # Tuples.
    params: dict[str, Any] = {
        name: _array(values, quote=name not in _ENQUEUE_NUMBERS)
        for (name, _), values in zip(ENQUEUE_INPUT, columns, strict=True)
    }
    params["notify"] = notify
    params["channel"] = NOTIFY_CHANNEL
    return params


def _array(values: tuple[Any, ...], *, quote: bool) -> str | None:
    """An array's text form (`{"a","b",NULL}`), which the statement casts to its type.

    One text parameter per column, not a list: psycopg adapts a list element
    by element in Python, which cost more than the statement saved. Texts are
    quoted (a backslash escapes a quote or a backslash in them), numbers are
    not. A column of NULLs is sent as NULL: unnest pads it to the others' length.
    """
    nulls = values.count(None)
    if nulls == len(values):
        return None
    if quote:
        return "{" + ",".join(map(_quoted, values)) + "}"
    if nulls:
        return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def _quoted(text: str | None) -> str:
    if text is None:
        return "NULL"
    if '"' in text or "\\" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _written(job: NewJob, source: NewJob, row: Sequence[Any]) -> dict[str, Any]:
    """The columns (JOB_COLUMNS) of a job ENQUEUE just inserted, from what it sent."""
    id_, _, enqueued_at, run_after, state, _, _ = row
    return {
        "id": id_,
        "task_path": job.task_path,
        "args": source.args,
        "kwargs": source.kwargs,
        "queue": job.queue,
        "backend": job.backend,
        "priority": job.priority,
        "state": state,
        "run_after": run_after,
        "enqueued_run_after": source.run_after,
        "errors": [],
        "return_value": None,
        "enqueued_at": enqueued_at,
        "started_at": None,
        "finished_at": None,
        "lease_owner": None,
        "tags": list(job.tags) if job.tags else None,
        "meta": job.meta or None,
        "progress": None,
    }


def enqueue_replace(
    cursor: Cursor, jobs: Sequence[NewJob], entries: list[Entry], notify: bool
) -> dict[Entry, _Outcome]:
    """ENQUEUE_REPLACE for these entries: those whose holder took their arguments."""
    if not entries:
        return {}
    rows = []
    for entry in entries:
        unique, source = jobs[entry.first].unique, jobs[entry.arguments_of(inserting=False)]
        assert unique is not None  # An entry with replacers has a unique key.
        rows.append(
            {
                "ord": entry.first,
                "unique_key": unique.key,
                "unique_period": unique.period,
                "args": source.args,
                "kwargs": source.kwargs,
                "run_after": source.run_after.isoformat() if source.run_after else None,
                "calls": len(entry.replacers),
            }
        )
    cursor.execute(
        ENQUEUE_REPLACE, {"rows": _json(rows), "notify": notify, "channel": NOTIFY_CHANNEL}
    )
    written = {row[0]: _job_row(row[1:-1]) for row in fetch_all(cursor)}
    return {
        entry: _Outcome(_found(written[entry.first]), True)
        for entry in entries
        if entry.first in written
    }


def _read(
    cursor: Cursor, jobs: Sequence[NewJob], entries: list[Entry]
) -> dict[Entry, tuple[bool, dict[str, Any] | None]]:
    """ENQUEUED_JOBS for these entries: (found by idempotency key, the job's row or None)."""
    if not entries:
        return {}
    rows = []
    for entry in entries:
        job = jobs[entry.first]
        rows.append(
            {
                "ord": entry.first,
                "idempotency_key": job.idempotency_key,
                "unique_key": job.unique.key if job.unique else None,
                "unique_period": job.unique.period if job.unique else None,
            }
        )
    cursor.execute(ENQUEUED_JOBS, {"rows": _json(rows)})
    found = {row[0]: (bool(row[1]), _job_row(row[2:])) for row in fetch_all(cursor)}
    return {entry: found.get(entry.first, (False, None)) for entry in entries}


def _job_row(values: Sequence[Any]) -> dict[str, Any]:
    row = dict(zip(JOB_COLUMNS, values, strict=True))
    for column in ("args", "kwargs", "errors", "return_value", "tags", "meta", "progress"):
        row[column] = loads_or_unreadable(row[column], column)
    return row


def _found(row: dict[str, Any]) -> Enqueued:
    return Enqueued(
        row["id"], row["enqueued_at"], row["run_after"], created=False, state=row["state"], row=row
    )


def _answer(
    jobs: Sequence[NewJob], entry: Entry, outcome: _Outcome, results: dict[int, Enqueued]
) -> None:
    """Each call of the entry gets the outcome: the first as it came, the others its job.

    A call that met an idempotency key must be the call that key names.
    """
    first = outcome.enqueued
    for index in entry.members:
        job = jobs[index]
        if job.idempotency_key and (index != entry.first or outcome.by_idempotency_key):
            named = first.row or _call_of(jobs[entry.first])  # The job as found, or as written.
            _check_same_operation(job.idempotency_key, first.id, job, named["task_path"],
                                  named["args"], named["kwargs"], named["queue"])  # fmt: skip
        replacer = outcome.wrote and index in entry.replacers
        if index != entry.first:
            results[index] = replace(first, created=False, replaced=replacer)
        elif first.created:  # Without the row its later calls get.
            results[index] = first if first.row is None else replace(first, row=None)
        else:
            results[index] = replace(first, replaced=replacer) if replacer else first


def _call_of(job: NewJob) -> dict[str, Any]:
    return {"task_path": job.task_path, "args": job.args, "kwargs": job.kwargs, "queue": job.queue}


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


# Read by ENQUEUE before it writes: the dependencies' states, share-locked
# until the caller commits, so a dependency cannot complete (or fail) between
# this read and the new edges' commit without its UNBLOCK seeing them. In id
# order, so two enqueues sharing dependencies never deadlock.
LOCK_DEPENDENCIES = """
SELECT id, state FROM conveyor_job WHERE id = ANY(%(ids)s) ORDER BY id FOR SHARE
"""


def lock_dependencies(cursor: Cursor, ids: Iterable[int]) -> dict[int, str]:
    """Share-lock these jobs until commit and return their states (part of ENQUEUE)."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    cursor.execute(LOCK_DEPENDENCIES, {"ids": ids})
    return dict(cursor.fetchall())


def pending_dependencies(cursor: Cursor, jobs: Sequence[NewJob]) -> list[int]:
    """Each job's count of unsatisfied dependencies; raises before any write."""
    for job in jobs:
        if len(set(job.depends_on)) > MAX_DEPENDENCIES:
            raise TooManyDependencies(
                f"A {job.task_path} job names {len(set(job.depends_on))} dependencies; "
                f"the limit is {MAX_DEPENDENCIES}. Fan in through intermediate steps."
            )
    states = lock_dependencies(cursor, (i for job in jobs for i in job.depends_on))
    pending = []
    for job in jobs:
        count = 0
        for dep in set(job.depends_on):
            state = states.get(dep)
            if state is None:
                raise DependencyNotFound(
                    f"Dependency {dep} of a {job.task_path} job names no job in this database."
                )
            if state in UNSUCCESSFUL_STATES and job.dependency_policy == "cancel":
                raise DependencyAlreadyFailed(
                    f"Dependency {dep} of a {job.task_path} job is already {state}, so the job "
                    "could never run; requeue the dependency first, or enqueue with "
                    "dependency_policy='run'."
                )
            if state != "completed" and state not in UNSUCCESSFUL_STATES:
                count += 1
        pending.append(count)
    return pending


# Part of ENQUEUE: the edges of the jobs it created, in the same transaction.
ENQUEUE_DEPENDENCIES = """
INSERT INTO conveyor_dependency (job_id, depends_on_id)
SELECT * FROM unnest(%(job_ids)s::bigint[], %(depends_on_ids)s::bigint[])
ON CONFLICT DO NOTHING
"""


def _add_edges(cursor: Cursor, jobs: Sequence[NewJob], results: Sequence[Enqueued]) -> None:
    job_ids: list[int] = []
    depends_on_ids: list[int] = []
    for job, row in zip(jobs, results, strict=True):
        if row.created:
            for dep in sorted(set(job.depends_on)):
                job_ids.append(row.id)
                depends_on_ids.append(dep)
    if job_ids:
        cursor.execute(ENQUEUE_DEPENDENCIES, {"job_ids": job_ids, "depends_on_ids": depends_on_ids})


# -- Claim: ready jobs, each with a new fencing token ----------------------------------------------


class Lease(NamedTuple):
    """A claimed job as the worker holds it: the row plus its fencing token.

    The token is (`owner`, `version`): every later write about this attempt is
    guarded by both, and the Lease carries them unchanged from CLAIM to that write.
    A named tuple, not a frozen dataclass: just as immutable, and built from a
    claimed row about seven times faster (one per job on the control loop).
    A value the row holds that Python cannot load is a `readable.Unreadable`
    (the worker fails that job without running it).
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
    isolated: bool  # Taken by CLAIM_ISOLATED: it runs without claim-ahead siblings.
    enqueued_run_after: datetime | None  # run_after as enqueued; None: not deferred.
    tags: list[str] | None  # Observability: the job's labels, None when it has none.
    meta: dict[str, Any] | None


# Both halves keep their cost in proportion to the batch, not the table:
# - the paused queues are taken out of the worker's list once, before the
#   scan, so it walks conveyor_job_claim_idx in claim order and stops after
#   `limit` rows (a per-row paused filter, `queue <> ALL(ARRAY(...))` or a
#   NOT EXISTS that meets statistics of conveyor_queue, makes the planner
#   expect one matching row and sort every ready row instead);
# - a worker of one queue names it as a constant (the planner folds the
#   `cardinality(...) <> 1 OR ...` test), so it walks conveyor_job_claim_queue_idx
#   and is not slowed by ready rows of other queues ahead of its own;
# - the update finds the picked rows by primary key (`id = ANY(ARRAY(...))`),
#   where a join to the CTE may become a hash join over the whole table once
#   the batch is a few hundred rows;
# - the claimed rows come back in claim order, sorting only the batch;
# - nothing in it can fail on a row's values: the pickup delay subtracts
#   epochs (float8: an infinite timestamp gives an infinite delay, where
#   timestamp subtraction raises), and a value Python cannot load comes back
#   as `readable.Unreadable`, for the worker to fail that job alone.
# What every claim returns, a Lease's fields in order, from its `claimed` rows.
_LEASE_OF_CLAIMED = """\
SELECT id, task_path, args, kwargs, queue, backend, priority, attempt, max_attempts,
       lease_version, idempotency_key, enqueued_at, started_at, lease_owner,
       date_part('epoch', started_at) - date_part('epoch', greatest(enqueued_at, run_after))
           AS pickup_delay,
       NULLIF(errors, '[]'::jsonb) AS errors, isolated, enqueued_run_after,
       tags, meta
FROM claimed
ORDER BY priority DESC, run_after, id
"""


def _claimed(started_at: str) -> str:
    """Every claim's `claimed` CTE: each `picked` row running, with a new fencing token.

    The one place a token is issued (lease_version + 1, the owner, a new
    lease); `started_at` is the SQL of when the attempt starts.
    """
    return f"""claimed AS (
    UPDATE conveyor_job AS j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_owner = %(owner)s,
        lease_version = j.lease_version + 1,
        lease_expires_at = now() + make_interval(secs => %(lease)s),
        started_at = {started_at}
    WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING j.*
)"""


# A queue with limits: CLAIM and CLAIM_ISOLATED leave its jobs to CLAIM_LIMITED.
_LIMITED = (
    "q.concurrency IS NOT NULL OR q.key_concurrency IS NOT NULL OR q.rate_count IS NOT NULL "
    "OR q.fair"
)


# The worker's queues that CLAIM may take from: not paused, without limits.
_CLAIMABLE = f"""ARRAY(
          SELECT s.name FROM unnest(%(queues)s::text[]) AS s(name)
          WHERE NOT EXISTS (
              SELECT 1 FROM conveyor_queue AS q WHERE q.name = s.name AND (q.paused OR {_LIMITED}))
      )"""


def _claim(which: str, limit: str) -> str:
    """A claim statement: pick ready rows (`which` of them, up to `limit`), give each a token."""
    return f"""
WITH picked AS (
    SELECT id FROM conveyor_job
    WHERE state = 'available'
      AND run_after <= now()
      AND queue = ANY({_CLAIMABLE})
      AND (cardinality(%(queues)s::text[]) <> 1 OR queue = (%(queues)s::text[])[1])
      AND {which}
    ORDER BY priority DESC, run_after, id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
), {_claimed("now()")}
{_LEASE_OF_CLAIMED}"""


# NOT isolated is a filter on the claim index (whose predicate is state alone):
# isolated rows are few, and they wait for CLAIM_ISOLATED.
CLAIM = _claim("NOT isolated", "%(limit)s")


# CLAIM for a worker of a few queues behind other queues' rows: the same rows,
# in the same order, read from one range of conveyor_job_claim_queue_idx per
# queue. CLAIM walks conveyor_job_claim_idx in claim order and filters by
# queue, so the ready rows of every queue it does not serve (or no longer
# does: paused, limited) that sort ahead of its own are passed on every
# claim: 10^6 of them made a claim of 100 jobs 80 times as long
# (tests/benchmarks/claim_behind.py).
# - `ahead`: the first `limit` ready rows of the worker's queues, without
#   locks, as a merge of one ordered branch per queue (PostgreSQL merges
#   UNION ALL branches lazily: it reads about `limit` rows in all); a paused
#   or limited queue's branch is cut by a one-time filter;
# - `picked`: each queue's share of those, locked FOR UPDATE SKIP LOCKED from
#   its own range, so the claim locks no more rows than it takes, and a row
#   another claimer holds is passed for the next one of the same queue.
# Its cost is fixed per claim (planning, and an index descent and a
# conveyor_queue probe per branch), several times CLAIM's when nothing is
# ahead, so a worker sends it only while its claim order service sees other
# queues' rows ahead (PASSED_AHEAD), and only for a few queues. It is sent
# unprepared (a generic plan, blind to which queue each branch reads, walks
# the claim index again) after JIT_OFF: the share's unknown LIMIT makes its
# estimate pass jit_above_cost, and compiling took 26 ms of a 27 ms claim.
MERGED_CLAIM_QUEUES = 8
_MERGED_BRANCH = """(SELECT queue, priority, run_after, id FROM conveyor_job
        WHERE state = 'available' AND run_after <= now() AND queue = {queue} AND NOT isolated
          AND NOT EXISTS (SELECT 1 FROM conveyor_queue AS q
                          WHERE q.name = {queue} AND (q.paused OR {limited}))
        ORDER BY priority DESC, run_after, id LIMIT %(limit)s)"""
CLAIM_MERGED = f"""
WITH ahead AS (
    {{branches}}
    ORDER BY priority DESC, run_after, id
    LIMIT %(limit)s
), share AS (
    SELECT queue, count(*) AS n FROM ahead GROUP BY queue
), picked AS (
    SELECT p.id FROM share CROSS JOIN LATERAL (
        SELECT id FROM conveyor_job
        WHERE state = 'available' AND run_after <= now() AND queue = share.queue AND NOT isolated
        ORDER BY priority DESC, run_after, id
        LIMIT share.n
        FOR UPDATE SKIP LOCKED
    ) AS p
), {_claimed("now()")}
{_LEASE_OF_CLAIMED}"""
# How many of the first %(scan)s available rows in claim order
# (conveyor_job_claim_idx, as CLAIM reads it) are of queues CLAIM does not
# take for a worker of %(queues)s: other queues, or its paused or limited
# ones, due or not. CLAIM passes each of them; CLAIM_MERGED reads none. (The
# worker's own rows not due yet, or isolated, both forms pass alike.) Read
# with JIT off, as a scan this long may pass jit_above_cost.
PASSED_AHEAD = f"""
SELECT count(*) FILTER (WHERE NOT (head.queue = ANY({_CLAIMABLE})))::int
FROM (SELECT queue FROM conveyor_job
      WHERE state = 'available'
      ORDER BY priority DESC, run_after, id
      LIMIT %(scan)s) AS head
"""
# JIT compilation off until the transaction ends (set_config's `true`).
JIT_OFF = "SELECT set_config('jit', 'off', true)"


@functools.cache
def claim_merged(queues: int) -> str:
    """CLAIM_MERGED for a worker of `queues` queues (the %(queues)s array's length)."""
    branches = "\n    UNION ALL\n    ".join(
        _MERGED_BRANCH.format(queue=f"(%(queues)s::text[])[{i}]", limited=_LIMITED)
        for i in range(1, queues + 1)
    )
    return CLAIM_MERGED.replace("{branches}", branches)


def claim(
    cursor: Cursor, *, owner: str, queues: Sequence[str], limit: int, lease_seconds: float
) -> list[Lease]:
    """Take up to `limit` ready jobs, each with a new fencing token.

    Guard: available, due, in `queues`, not in a paused queue, not isolated,
    and not locked by another claimer. Zero rows means nothing is ready.
    """
    send_claim(cursor, owner=owner, queues=queues, limit=limit, lease_seconds=lease_seconds)
    return claimed_leases(cursor)


def send_claim(
    cursor: Cursor,
    *,
    owner: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float,
    merged: bool = False,
) -> None:
    """CLAIM (or CLAIM_MERGED), its result not read yet (a pipeline reads it later:
    `claimed_leases`). `merged`: as CLAIM_MERGED, two statements (the caller's
    transaction); which form pays is the worker's route (claims.Claimer.merged)."""
    params = {"queues": list(queues), "limit": limit, "owner": owner, "lease": lease_seconds}
    if merged:
        cursor.execute(JIT_OFF)
        cursor.execute(claim_merged(len(queues)), params, prepare=False)
    else:
        cursor.execute(CLAIM, params)


def passed_ahead(cursor: Cursor, *, queues: Sequence[str], scan: int) -> int:
    """PASSED_AHEAD: of the first `scan` ready rows in claim order, those CLAIM passes."""
    cursor.execute(PASSED_AHEAD, {"queues": list(queues), "scan": scan})
    row = cursor.fetchone()
    return int(row[0]) if row else 0


def claimed_leases(cursor: Cursor) -> list[Lease]:
    """The leases a claim statement returned."""
    return list(map(Lease._make, fetch_all(cursor)))


# One job, in a statement of its own. The NOT EXISTS reads the worker's
# running isolated rows (at most one) through conveyor_job_isolated_held_idx.
CLAIM_ISOLATED = _claim(
    """isolated
      AND NOT EXISTS (
          SELECT 1 FROM conveyor_job AS mine
          WHERE mine.state = 'running' AND mine.isolated AND mine.lease_owner = %(owner)s)""",
    "1",
)


def claim_isolated(
    cursor: Cursor, *, owner: str, queues: Sequence[str], limit: int = 1, lease_seconds: float
) -> list[Lease]:
    """Take at most one isolated job (one REAP returned), with a new fencing token.

    Guard: as CLAIM's, but isolated; and `owner` holds no running isolated
    job. The caller's part of the guard: it holds no claimed job that has
    not started, and claims ahead of it nothing while this one runs. Zero
    rows means no isolated job is ready, or this worker already runs one.
    `limit` is accepted for the claim steps' shared call, and ignored.
    """
    cursor.execute(CLAIM_ISOLATED, {"queues": list(queues), "owner": owner, "lease": lease_seconds})
    return list(map(Lease._make, fetch_all(cursor)))


# -- Limited claims: queues with flow control (docs/flow-control.md) -------------------------------

# The first statement of a limited claim: lock the rows of the worker's
# queues that have limits (in name order, so two claimers never deadlock).
# CLAIM_LIMITED then runs as a statement of its own, whose snapshot is taken
# after the lock was granted: it sees every claim of the queue that committed
# before, and no claim of the queue commits while it counts and claims. The
# lock is held to the end of the worker's cycle transaction.
# It also turns JIT compilation off for the rest of the transaction: the
# planner's estimate for CLAIM_LIMITED (its fair walk, never run for most
# queues) passes jit_above_cost once the queue has a backlog, and compiling
# took about 150 ms per claim for a statement that runs in under one.
LOCK_LIMITED = f"""
SELECT q.name, set_config('jit', 'off', true) FROM conveyor_queue AS q
WHERE q.name = ANY(%(queues)s::text[]) AND NOT q.paused AND ({_LIMITED})
ORDER BY q.name
FOR NO KEY UPDATE
"""


LIMITED_QUEUES = f"""
SELECT q.name, q.rate_count IS NOT NULL FROM conveyor_queue AS q
WHERE q.name = ANY(%(queues)s::text[]) AND ({_LIMITED})
"""


def limited_queues(cursor: Cursor, *, queues: Sequence[str]) -> dict[str, bool]:
    """Which of `queues` have limits now, each with whether it has a rate (a route
    for the worker, not a guard: a rate's queue is claimed for free slots only)."""
    cursor.execute(LIMITED_QUEUES, {"queues": list(queues)})
    return {name: rated for name, rated in cursor.fetchall()}


# A burst worker that claimed nothing keeps going while jobs of its limited
# queues wait for room: a limit delays them, it does not make them not ready.
READY_LIMITED = """
SELECT EXISTS (
    SELECT 1 FROM conveyor_job AS j
    WHERE j.state = 'available' AND j.run_after <= now() AND j.queue = ANY(ARRAY(
        SELECT q.name FROM conveyor_queue AS q
        WHERE q.name = ANY(%(queues)s::text[]) AND NOT q.paused))
)
"""


def ready_limited(cursor: Cursor, *, queues: Sequence[str]) -> bool:
    """Whether any of these (limited) queues, not paused, has a job ready to run."""
    if not queues:
        return False
    cursor.execute(READY_LIMITED, {"queues": list(queues)})
    return bool(cursor.fetchall()[0][0])


def lock_limited(cursor: Cursor, *, queues: Sequence[str]) -> list[str]:
    """Lock the limited queues among `queues`; returns their names (paused ones left out)."""
    if not queues:
        return []
    cursor.execute(LOCK_LIMITED, {"queues": list(queues)})
    return [row[0] for row in cursor.fetchall()]


def _next_key(after: str) -> str:
    """One step of the fair walk, as `k`: the queue's first key with ready jobs after
    `after`, else its first key (round the ring); an index probe of
    conveyor_job_key_ready_idx each."""
    keys = """SELECT j.concurrency_key FROM conveyor_job AS j
         WHERE j.state = 'available' AND j.queue = %(queue)s AND j.concurrency_key IS NOT NULL"""
    return f"""SELECT coalesce(
        ({keys} AND j.concurrency_key > {after}
         ORDER BY j.concurrency_key LIMIT 1),
        ({keys}
         ORDER BY j.concurrency_key LIMIT 1)) AS k"""


# How CLAIM_LIMITED keeps its cost in proportion to the batch and the limit,
# not to the table or the backlog of one key:
# - room: the batch, less the queue's running rows under `concurrency`, less
#   the starts logged in the last rate period under `rate` (least() skips
#   a limit that is NULL); the running rows are counted only when a limit
#   needs them, through conveyor_job_reap_idx (at most `concurrency` rows);
# - the batch: the worker's free slots (`free`), and up to `limit` with its
#   claim-ahead buffer, but only from half the headroom the free slots leave
#   under `concurrency` (all of it when there is no such limit), and never
#   under `rate`: a claimed job counts as running, so jobs claimed ahead
#   hold a little capacity while the limit is far, none once it is near;
#   and a claim is a start under `rate`, so that rate is never claimed ahead;
# - a queue with `key_concurrency` or `fair` walks its keys with ready jobs
#   through conveyor_job_key_ready_idx, one index probe per key, from the
#   queue's cursor round the ring, at most room + running keys (a key with
#   no room has a running job, so among that many keys are `room` with room
#   when there are); under `key_concurrency` it reads the queue's running
#   rows with a key once, counted by key, and joins the walked keys to the
#   counts (a count per walked key, through an index the planner may pick
#   wrongly when its statistics saw no running rows, read every running row
#   once per key: 150 ms for a claim of 1,000 over 1,000 keys);
# - each walked key gives its first ready jobs in claim order, up to its
#   room (and, when fair, its share of the batch); jobs without a key are one
#   more group, read from the head of the queue's ready jobs;
# - the chosen rows are locked (SKIP LOCKED, rechecking that they are still
#   available) and claimed as CLAIM claims; the queue's row then records the
#   cursor (the last key served) and the rate window's log, in the statement
#   that counted, under the lock. The log holds one entry per claim in the
#   window (at most `rate` entries), stamped with clock_timestamp() taken
#   under the lock, so stamps grow with the order of the claims, and the
#   jobs' started_at is that stamp.
# Isolated jobs of a limited queue (REAP returned them) are claimed by this
# statement too (`isolated` true, a limit of 1, through
# conveyor_job_isolated_idx), with CLAIM_ISOLATED's guard.
CLAIM_LIMITED = f"""
WITH RECURSIVE q AS (
    SELECT q.name, q.concurrency, q.key_concurrency, q.fair, q.rate_count, q.rate_seconds,
           q.rate_times, q.rate_counts,
           (q.key_concurrency IS NOT NULL OR q.fair) AS keyed,
           coalesce(q.fair_cursor, '') AS cursor,
           clock_timestamp() AS stamp
    FROM conveyor_queue AS q
    WHERE q.name = %(queue)s AND NOT q.paused
), logged AS (  -- The rate window's entries (t, c): c starts at epoch t.
    SELECT r.t, r.c
    FROM q, unnest(q.rate_times, q.rate_counts) AS r(t, c)
    WHERE r.t > date_part('epoch', q.stamp) - q.rate_seconds
), started AS (
    SELECT coalesce(sum(c), 0) AS n FROM logged
), counted AS (
    SELECT q.*,
           CASE WHEN q.concurrency IS NOT NULL OR q.keyed THEN (
               SELECT count(*) FROM conveyor_job AS r
               WHERE r.state = 'running' AND r.queue = %(queue)s) ELSE 0 END AS running
    FROM q
), room AS (
    SELECT c.*, CASE
        WHEN %(isolated)s AND EXISTS (
            SELECT 1 FROM conveyor_job AS mine
            WHERE mine.state = 'running' AND mine.isolated AND mine.lease_owner = %(owner)s)
        THEN 0
        ELSE greatest(0, least(
            %(free)s::int + greatest(0, least(
                %(limit)s::int - %(free)s::int,
                CASE WHEN c.rate_count IS NOT NULL THEN 0
                     ELSE (c.concurrency - c.running - %(free)s::int) / 2 END)),
            c.concurrency - c.running,
            c.rate_count - (SELECT n FROM started)))::int END AS n
    FROM counted AS c
), walk(k, pos, first) AS (
    SELECT s.k, 1, s.k
    FROM room, LATERAL ({_next_key("room.cursor")}) AS s
    WHERE room.keyed AND room.n > 0 AND s.k IS NOT NULL
  UNION ALL
    SELECT s.k, w.pos + 1, w.first
    FROM walk AS w, room, LATERAL ({_next_key("w.k")}) AS s
    WHERE w.pos < room.n + room.running AND s.k <> w.first
), unkeyed AS (
    SELECT h.id, h.priority, h.run_after, 0 AS pos,
           row_number() OVER (ORDER BY h.priority DESC, h.run_after, h.id) AS rank
    FROM (
        SELECT j.id, j.priority, j.run_after, j.concurrency_key FROM conveyor_job AS j
        WHERE j.state = 'available' AND j.queue = %(queue)s
          AND j.run_after <= now() AND NOT j.isolated AND NOT %(isolated)s
          AND (SELECT keyed AND n > 0 FROM room)
        ORDER BY j.priority DESC, j.run_after, j.id
        LIMIT (SELECT 2 * n FROM room)
    ) AS h
    WHERE h.concurrency_key IS NULL
), share AS (
    SELECT CASE WHEN room.fair
                THEN ceil(room.n::float8 / greatest(1, (SELECT count(*) FROM walk)
                    + (SELECT count(*) FROM (SELECT 1 FROM unkeyed LIMIT 1) AS any_unkeyed)))::int
                ELSE room.n END AS n
    FROM room
), key_running AS (  -- Each key's running rows, when `key_concurrency` needs them.
    SELECT r.concurrency_key AS k, count(*) AS n FROM conveyor_job AS r
    WHERE r.state = 'running' AND r.queue = %(queue)s AND r.concurrency_key IS NOT NULL
      AND (SELECT key_concurrency IS NOT NULL AND n > 0 FROM room)
    GROUP BY r.concurrency_key
), walked AS (  -- Each walked key's room under `key_concurrency` (NULL: no such limit).
    SELECT w.k, w.pos, room.key_concurrency - coalesce(kr.n, 0) AS key_room
    FROM walk AS w CROSS JOIN room LEFT JOIN key_running AS kr ON kr.k = w.k
), keyed AS (
    SELECT c.id, c.priority, c.run_after, w.pos, c.rank
    FROM walked AS w, LATERAL (
        SELECT j.id, j.priority, j.run_after,
               row_number() OVER (
                   ORDER BY j.concurrency_key, j.priority DESC, j.run_after, j.id) AS rank
        FROM conveyor_job AS j
        -- The key as a range of one, and first in the order and the rank: with
        -- `= w.k` the planner drops the key from the order (it is fixed), and
        -- when its statistics think one key is every row it may walk the claim
        -- order of every queue (conveyor_job_claim_idx) past that key's backlog
        -- to find this key's rows; this order only conveyor_job_key_ready_idx
        -- gives, so every plan reads the key's own rows.
        WHERE j.state = 'available' AND j.queue = %(queue)s
          AND j.concurrency_key >= w.k AND j.concurrency_key <= w.k
          AND j.run_after <= now() AND NOT j.isolated AND NOT %(isolated)s
        ORDER BY j.concurrency_key, j.priority DESC, j.run_after, j.id
        LIMIT greatest(0, least((SELECT n FROM share), w.key_room))
    ) AS c
), plain AS (
    SELECT j.id, j.priority, j.run_after, 0 AS pos, 1::bigint AS rank FROM conveyor_job AS j
    WHERE j.state = 'available' AND j.queue = %(queue)s
      AND j.run_after <= now() AND NOT j.isolated AND NOT %(isolated)s
      AND (SELECT NOT keyed AND n > 0 FROM room)
    ORDER BY j.priority DESC, j.run_after, j.id
    LIMIT (SELECT n FROM room)
), alone AS (
    SELECT j.id, j.priority, j.run_after, 0 AS pos, 1::bigint AS rank FROM conveyor_job AS j
    WHERE j.state = 'available' AND j.isolated AND j.queue = %(queue)s
      AND j.run_after <= now() AND %(isolated)s AND (SELECT n > 0 FROM room)
      AND (j.concurrency_key IS NULL OR (SELECT key_concurrency FROM room) IS NULL
           OR (SELECT count(*) FROM conveyor_job AS r
               WHERE r.state = 'running' AND r.queue = %(queue)s
                 AND r.concurrency_key = j.concurrency_key) < (SELECT key_concurrency FROM room))
    ORDER BY j.priority DESC, j.run_after, j.id
    LIMIT 1
), chosen AS (
    SELECT c.id, c.pos FROM (
        SELECT * FROM keyed UNION ALL SELECT * FROM unkeyed
        UNION ALL SELECT * FROM plain UNION ALL SELECT * FROM alone
    ) AS c, room
    ORDER BY CASE WHEN room.fair THEN c.rank END, CASE WHEN room.fair THEN c.pos END,
             c.priority DESC, c.run_after, c.id
    LIMIT (SELECT n FROM room)
), picked AS (
    SELECT j.id FROM conveyor_job AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.state = 'available'
    FOR UPDATE SKIP LOCKED
), {_claimed("(SELECT stamp FROM q)")}, served AS (
    SELECT count(*)::int AS n,
           max(c.pos) FILTER (WHERE c.pos > 0) AS last_pos
    FROM claimed JOIN chosen AS c ON c.id = claimed.id
), kept AS (  -- The window after this claim: what is in it, and this claim's starts.
    SELECT t, c FROM logged
    UNION ALL
    SELECT date_part('epoch', q.stamp), served.n FROM q, served WHERE served.n > 0
), noted AS (
    UPDATE conveyor_queue AS u
    SET fair_cursor = CASE WHEN room.keyed THEN coalesce(
            (SELECT w.k FROM walk AS w WHERE w.pos = (SELECT last_pos FROM served)),
            (SELECT w.k FROM walk AS w ORDER BY w.pos DESC LIMIT 1),
            u.fair_cursor) ELSE NULL END,
        rate_times = CASE WHEN room.rate_count IS NULL THEN '{{}}'::float8[]
                          ELSE ARRAY(SELECT t FROM kept ORDER BY t) END,
        rate_counts = CASE WHEN room.rate_count IS NULL THEN '{{}}'::int[]
                           ELSE ARRAY(SELECT c FROM kept ORDER BY t) END
    FROM room
    WHERE u.name = room.name
      AND (room.keyed OR room.rate_count IS NOT NULL
           OR u.fair_cursor IS NOT NULL OR cardinality(u.rate_times) > 0)
)
{_LEASE_OF_CLAIMED}"""


def claim_limited(
    cursor: Cursor,
    *,
    owner: str,
    queue: str,
    limit: int,
    lease_seconds: float,
    isolated: bool = False,
    free: int | None = None,
) -> list[Lease]:
    """Take up to `limit` ready jobs of limited `queue`, within its limits, each with a token.

    `free` of them (all when None) fill free slots; the rest are claimed
    ahead only while the queue's limits are far (CLAIM_LIMITED's batch).

    Guard: as CLAIM's (or, with `isolated`, CLAIM_ISOLATED's), and the
    queue's limits: its running jobs under `concurrency`, each key's under
    `key_concurrency`, the starts of the last period under `rate`. The
    caller has locked the queue's row in this transaction (lock_limited),
    in an earlier statement. Zero rows: nothing ready, or no room.
    """
    cursor.execute(
        CLAIM_LIMITED,
        {
            "queue": queue,
            "limit": 1 if isolated else limit,
            "free": 1 if isolated else (limit if free is None else min(limit, free)),
            "owner": owner,
            "lease": lease_seconds,
            "isolated": isolated,
        },
    )
    return list(map(Lease._make, fetch_all(cursor)))


# -- Outcomes: what the holder of a lease writes, under its token ----------------------------------


_HELD = "FROM jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint, version bigint"


def _guarded(cursor: Cursor, sql: str, owner: str, held: list[dict[str, Any]]) -> set[int]:
    if not held:
        return set()
    cursor.execute(sql, {"held": _json(held), "owner": owner})
    return {row[0] for row in cursor.fetchall()}


class Renewed(set[int]):
    """The ids HEARTBEAT renewed; `cancel_requested` are those an operator asked to stop.

    `locked` are held jobs it could not renew because another transaction
    had their row locked: still this worker's, renewed by a later beat.
    """

    def __init__(self, rows: Iterable[tuple[int, bool]] = (), locked: Iterable[int] = ()) -> None:
        rows = list(rows)
        super().__init__(id_ for id_, _ in rows)
        self.cancel_requested = frozenset(id_ for id_, requested in rows if requested)
        self.locked = frozenset(locked)


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


# HEARTBEAT with the progress handlers reported since the last beat
# (context.set_progress), in the same statement under the same fence: the
# worker sends it instead of HEARTBEAT when some lease has progress to write,
# so a beat stays one statement. A held row without new progress keeps its
# own; a row it skips (locked) is written by a later beat.
HEARTBEAT_PROGRESS = """
WITH renew AS (
    SELECT j.id, h.progress
    FROM conveyor_job AS j
    JOIN jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint, version bigint, progress jsonb)
      ON j.id = h.id AND j.lease_version = h.version
    WHERE j.state = 'running' AND j.lease_owner = %(owner)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE conveyor_job AS j
SET lease_expires_at = now() + make_interval(secs => %(lease)s),
    progress = CASE WHEN renew.progress IS NULL THEN j.progress
        ELSE renew.progress || jsonb_build_object('attempt', j.attempt, 'updated_at', now()) END
FROM renew
WHERE j.id = renew.id
RETURNING j.id, j.cancel_requested_at IS NOT NULL
"""

# A plain read, no lock, only when HEARTBEAT missed some of the held rows:
# SKIP LOCKED also skips a row that another worker's CLAIM has just locked
# and then rejected (PostgreSQL keeps that lock until the claim commits).
# A row that still carries this worker's token is held, not lost.
STILL_HELD = """
SELECT j.id FROM conveyor_job AS j
JOIN jsonb_to_recordset(%(held)s::jsonb) AS h(id bigint, version bigint)
  ON j.id = h.id AND j.lease_version = h.version
WHERE j.state = 'running' AND j.lease_owner = %(owner)s
"""


def heartbeat(
    cursor: Cursor, *, owner: str, held: Iterable[tuple[int, int]], lease_seconds: float
) -> Renewed:
    """Renew every lease the worker holds; a job in neither the result nor
    its `locked` is lost.

    Guard: state running, owner and version; rows locked by another
    transaction are skipped, never waited for. Zero rows renewed means every
    lease was lost or locked; the ids it missed are read again, without a
    lock (one more round trip, only then), and those still carrying the
    token come back in `locked`. The result also says which renewed jobs
    have a cancel request.
    """
    rows = [{"id": id_, "version": version} for id_, version in held]
    return _renew(cursor, HEARTBEAT, owner, rows, lease_seconds)


def heartbeat_progress(
    cursor: Cursor,
    *,
    owner: str,
    held: Iterable[tuple[int, int, dict[str, Any] | None]],
    lease_seconds: float,
) -> Renewed:
    """HEARTBEAT that also writes the progress each (id, version, progress) carries.

    Guard and result as HEARTBEAT's; a progress of None leaves the row's own.
    The attempt and the database time are added to each progress written.
    """
    rows = [
        {"id": i, "version": v} if p is None else {"id": i, "version": v, "progress": p}
        for i, v, p in held
    ]
    return _renew(cursor, HEARTBEAT_PROGRESS, owner, rows, lease_seconds)


def _renew(
    cursor: Cursor, sql: str, owner: str, held: list[dict[str, Any]], lease_seconds: float
) -> Renewed:
    if not held:
        return Renewed()
    cursor.execute(sql, {"held": _json(held), "owner": owner, "lease": lease_seconds})
    rows = cursor.fetchall()
    renewed = {id_ for id_, _ in rows}
    missed = [h for h in held if h["id"] not in renewed]
    if not missed:
        return Renewed(rows)
    cursor.execute(STILL_HELD, {"held": _json(missed), "owner": owner})
    return Renewed(rows, locked=[row[0] for row in cursor.fetchall()])


# A cancel request refuses the completion: the job was answered "will end
# cancelled", so it must not end completed (its holder writes CANCEL_HELD).
# UNBLOCK is part of the statement (one round trip): it counts the jobs
# `done` really wrote off their blocked dependents, which are other rows
# (blocked, never running), locked after the completed ones as before. Data-
# modifying CTEs run to completion whether or not the outer query reads them.
COMPLETE = f"""
WITH done AS (
    UPDATE conveyor_job AS j
    SET state = 'completed', return_value = h.return_value, finished_at = now(),
        lease_expires_at = NULL, isolated = false
    {_HELD}, return_value jsonb)
    WHERE j.id = h.id AND j.state = 'running'
      AND j.lease_owner = %(owner)s AND j.lease_version = h.version
      AND j.cancel_requested_at IS NULL
    RETURNING j.id
), {_dependents_of("IN (SELECT id FROM done)")}, unblocked AS (
{_unblocked()}
)
SELECT id FROM done
"""


def complete(
    cursor: Cursor, *, owner: str, done: Iterable[tuple[int, int, Any]], notify: bool = True
) -> set[int]:
    """Mark jobs completed with their return values; returns the ids written.

    Guard: state running, owner and version (the token), and no cancel
    request. Zero rows for a job means the lease was lost, or an operator
    asked to cancel it: its holder then writes CANCEL_HELD (`cancel_held`),
    in the same transaction. Their dependents are unblocked by the same
    statement (UNBLOCK's update), only for the ids written: a refused
    completion unblocks nothing.
    """
    if not send_complete(cursor, owner=owner, done=done, notify=notify):
        return set()
    return written_ids(cursor)


def send_complete(
    cursor: Cursor, *, owner: str, done: Iterable[tuple[int, int, Any]], notify: bool = True
) -> bool:
    """COMPLETE, its result not read yet (a pipeline reads it later: `written_ids`).

    False: nothing to complete, nothing sent.
    """
    held = [{"id": i, "version": v, "return_value": r} for i, v, r in done]
    if not held:
        return False
    cursor.execute(
        COMPLETE,
        {"held": _json(held), "owner": owner, "notify": notify, "channel": NOTIFY_CHANNEL},
    )
    return True


def written_ids(cursor: Cursor) -> set[int]:
    """The ids a fenced write returned: those the fence let through."""
    return {row[0] for row in cursor.fetchall()}


RECORD_RESULT = f"""
UPDATE conveyor_job AS j
SET return_value = h.return_value
{_HELD}, return_value jsonb)
WHERE j.id = h.id AND j.state = 'completed'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
  AND j.cancel_requested_at IS NULL
RETURNING j.id
"""


def record_result(cursor: Cursor, *, owner: str, done: Iterable[tuple[int, int, Any]]) -> set[int]:
    """Store return values of jobs this token already completed in context.atomic()."""
    held = [{"id": i, "version": v, "return_value": r} for i, v, r in done if r is not None]
    return _guarded(cursor, RECORD_RESULT, owner, held)


_ERROR_ENTRY = _error_entry("h.error")  # The worker's entry for the attempt (error_entry()).


RETRY = f"""
UPDATE conveyor_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
    run_after = now() + make_interval(secs => h.delay),
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                         OR j.attempt >= j.max_attempts THEN now() END,
    errors = j.errors || {_ERROR_ENTRY},
    lease_owner = NULL, lease_expires_at = NULL, isolated = false
{_HELD}, delay float8, error jsonb)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id, j.state
"""


def retry(
    cursor: Cursor, *, owner: str, failures: Iterable[tuple[int, int, float, dict[str, Any]]]
) -> dict[int, str]:
    """Return failed attempts to `available` after a delay, or `dead` when used up."""
    held = [{"id": i, "version": v, "delay": d, "error": e} for i, v, d, e in failures]
    if not held:
        return {}
    cursor.execute(RETRY, {"held": _json(held), "owner": owner})
    states = {id_: state for id_, state in cursor.fetchall()}
    cancel_dependents(cursor, ids=[i for i, state in states.items() if state == "dead"])
    return states


FAIL = f"""
UPDATE conveyor_job AS j
SET state = 'failed', finished_at = now(), errors = j.errors || {_ERROR_ENTRY},
    lease_owner = NULL, lease_expires_at = NULL, isolated = false
{_HELD}, error jsonb)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""


def fail(
    cursor: Cursor, *, owner: str, failures: Iterable[tuple[int, int, dict[str, Any]]]
) -> set[int]:
    """Move jobs to `failed` at once (the handler said never retry)."""
    held = [{"id": i, "version": v, "error": e} for i, v, e in failures]
    failed = _guarded(cursor, FAIL, owner, held)
    cancel_dependents(cursor, ids=failed)
    return failed


# RETRY, SNOOZE and RELEASE hand a running job back; one with a cancel
# request ends cancelled instead, so that it never runs again (as REAP does):
# the handler may have ended before its worker's heartbeat told it.
_HAND_BACK = "CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'available' END"


_HANDED_BACK_AT = "CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() END"


# A note (a delay the worker capped) goes to history; without one, history is untouched.
SNOOZE = f"""
UPDATE conveyor_job AS j
SET state = {_HAND_BACK}, finished_at = {_HANDED_BACK_AT}, attempt = j.attempt - 1,
    run_after = now() + make_interval(secs => h.delay), lease_owner = NULL, lease_expires_at = NULL,
    isolated = false,
    history = CASE WHEN h.note IS NULL THEN j.history
                   ELSE j.history || {_history("snooze_capped", "h.note")} END
{_HELD}, delay float8, note text)
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""


def snooze(
    cursor: Cursor,
    *,
    owner: str,
    snoozed: Iterable[tuple[int, int, float, str | None]],
    actor: str = DEFAULT_ACTOR,
) -> set[int]:
    """Run jobs again after a delay, giving back the attempt they used.

    Each row is (id, version, delay, note); a note (a delay that was capped)
    is appended to the job's history under `actor`.
    """
    held = [{"id": i, "version": v, "delay": d, "note": n} for i, v, d, n in snoozed]
    if not held:
        return set()
    cursor.execute(SNOOZE, {"held": _json(held), "owner": owner, "actor": actor})
    return {row[0] for row in cursor.fetchall()}


# The handler did not finish: an isolated job stays isolated.
RELEASE = f"""
UPDATE conveyor_job AS j
SET state = {_HAND_BACK}, finished_at = {_HANDED_BACK_AT}, attempt = j.attempt - 1,
    lease_owner = NULL, lease_expires_at = NULL
{_HELD})
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
RETURNING j.id
"""


def release(cursor: Cursor, *, owner: str, held: Iterable[tuple[int, int]]) -> set[int]:
    """Hand leases back at once (graceful shutdown); the attempt is not counted."""
    rows = [{"id": i, "version": v} for i, v in held]
    return _guarded(cursor, RELEASE, owner, rows)


_CANCELLED_HELD_ENTRY = _error_entry("""jsonb_build_object(
        'exception_class_path', 'django_conveyor.exceptions.Cancelled',
        'traceback', 'Cancelled while running, at the request of '
            || j.cancel_requested_by || '.')""")

CANCEL_HELD = f"""
UPDATE conveyor_job AS j
SET state = 'cancelled', finished_at = now(),
    errors = j.errors || {_CANCELLED_HELD_ENTRY},
    history = j.history || {
    _history("cancel_held", "'stopped while running, as ' || j.cancel_requested_by || ' asked'")
},
    lease_owner = NULL, lease_expires_at = NULL, isolated = false
{_HELD})
WHERE j.id = h.id AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = h.version
  AND j.cancel_requested_at IS NOT NULL
RETURNING j.id
"""


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
    cancelled = {row[0] for row in cursor.fetchall()}
    cancel_dependents(cursor, ids=cancelled)
    return cancelled


# The bound on a guarded transaction (context.atomic()), set before its lock.
# A worker frozen (SIGSTOP) or hung inside it would otherwise keep the job's
# row lock, which REAP skips, for ever. PostgreSQL cancels a statement that
# runs longer than statement_timeout (the transaction aborts and its locks
# go at once) and terminates a session idle in its transaction for longer
# than idle_in_transaction_session_timeout (rolled back, locks released, the
# zombie's next statement and its commit fail). is_local: both settings end
# with the transaction, as SET LOCAL, so they also hold behind a pooler.
BOUND_TRANSACTION = """
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('idle_in_transaction_session_timeout', %(ms)s, true)
"""


def bound_transaction(cursor: Cursor, *, seconds: float) -> None:
    """End this transaction if a statement runs, or it idles, for longer than `seconds`."""
    cursor.execute(BOUND_TRANSACTION, {"ms": str(max(1, round(seconds * 1000)))})


# A cancel request refuses the lock: no effect commits after an operator's cancel.
LOCK_FOR_EFFECT = """
SELECT id FROM conveyor_job
WHERE id = %(id)s AND state = 'running'
  AND lease_owner = %(owner)s AND lease_version = %(version)s
  AND cancel_requested_at IS NULL
FOR UPDATE
"""


def lock_for_effect(cursor: Cursor, *, job_id: int, owner: str, version: int) -> bool:
    """Lock the job row for the caller's transaction if the token still holds it.

    False when the token lost the job or an operator asked to cancel it.
    """
    cursor.execute(LOCK_FOR_EFFECT, {"id": job_id, "owner": owner, "version": version})
    return bool(cursor.fetchall())


# Part of the outcome statements (not an action: it writes conveyor_job_log,
# not conveyor_job): the log records of attempts whose outcome this cycle
# wrote, in the same transaction. The join on the token refuses a log of an
# attempt whose job a later CLAIM took; the caller passes only the ids the
# fenced outcome statements wrote, so a refused outcome writes no log.
ATTEMPT_LOG = """
INSERT INTO conveyor_job_log (job_id, lease_version, attempt, worker, records, dropped, written_at)
SELECT j.id, j.lease_version, j.attempt, %(owner)s, h.records, h.dropped, now()
FROM jsonb_to_recordset(%(logs)s::jsonb) AS h(id bigint, version bigint, records jsonb, dropped int)
JOIN conveyor_job AS j ON j.id = h.id AND j.lease_version = h.version
ON CONFLICT (job_id, lease_version) DO NOTHING
"""


def attempt_log(cursor: Cursor, *, owner: str, logs: list[dict[str, Any]]) -> None:
    """Keep each attempt's records: `logs` of {id, version, records, dropped}."""
    if logs:
        cursor.execute(ATTEMPT_LOG, {"owner": owner, "logs": _json(logs)})


# -- Maintenance: any worker, on any worker's jobs -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reaped:
    id: int
    state: str
    task_path: str
    queue: str
    attempt: int
    owner: str | None
    version: int
    started: bool  # Its worker may have started it; False: it went back with its attempt.


_REAPED_ENTRY = _error_entry("""jsonb_build_object(
        'exception_class_path', CASE WHEN j.cancel_requested_at IS NOT NULL
            THEN 'django_conveyor.exceptions.Cancelled'
            ELSE 'django_conveyor.exceptions.LeaseLost' END,
        'traceback', 'The lease expired at ' || j.lease_expires_at || CASE
            WHEN j.cancel_requested_at IS NOT NULL
            THEN ' after a cancel request by ' || j.cancel_requested_by
                || '; the reaper cancelled the job.'
            ELSE ' without a heartbeat; the job was taken back by the reaper.' END)""")

# `unstarted`: REAP counts these entries to bound how often an attempt is given back.
_UNSTARTED_ENTRY = _error_entry("""jsonb_build_object(
        'exception_class_path', CASE WHEN j.cancel_requested_at IS NOT NULL
            THEN 'django_conveyor.exceptions.Cancelled'
            ELSE 'django_conveyor.exceptions.LeaseLost' END,
        'traceback', 'The lease expired at ' || j.lease_expires_at
            || ' before the job started (its worker never listed it as started); ' || CASE
            WHEN j.cancel_requested_at IS NOT NULL
            THEN 'after a cancel request by ' || j.cancel_requested_by
                || ', the reaper cancelled the job.'
            ELSE 'the reaper gave its attempt back.' END,
        'unstarted', true)""")

# A job its worker may have started (listed in the worker's may_start, or a
# worker whose list is NULL or whose row is gone) may have killed it: back
# to available it runs alone (isolated), and the attempt counts. One its
# worker never listed did not run: it goes back as it was, with its attempt,
# at most max_attempts times (a worker that dies while fetching a claim,
# before listing anything, must not loop for ever). The owners' rows are
# locked FOR SHARE: a worker lists jobs (DECLARE_STARTS) under its row's lock
# before it checks their leases, so REAP reads a list that was committed.
REAP = f"""
WITH expired AS (
    SELECT id, lease_owner FROM conveyor_job
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), owners AS (
    SELECT w.id, w.may_start FROM conveyor_worker AS w
    WHERE w.id IN (SELECT lease_owner FROM expired)
    FOR SHARE
), judged AS (
    SELECT e.id, e.lease_owner,
           o.may_start IS NULL OR e.id = ANY(o.may_start)
           OR jsonb_array_length(jsonb_path_query_array(r.errors, '$[*] ? (@.unstarted == true)'))
              >= r.max_attempts AS started
    FROM expired AS e
    JOIN conveyor_job AS r ON r.id = e.id
    LEFT JOIN owners AS o ON o.id = e.lease_owner
)
UPDATE conveyor_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN x.started AND j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                         OR (x.started AND j.attempt >= j.max_attempts) THEN now() END,
    attempt = CASE WHEN x.started THEN j.attempt ELSE j.attempt - 1 END,
    run_after = now(),
    lease_owner = NULL,
    lease_expires_at = NULL,
    -- It may have killed its worker: back to available, it runs alone.
    isolated = j.cancel_requested_at IS NULL
        AND CASE WHEN x.started THEN j.attempt < j.max_attempts ELSE j.isolated END,
    errors = j.errors || CASE WHEN x.started THEN {_REAPED_ENTRY} ELSE {_UNSTARTED_ENTRY} END
FROM judged AS x
WHERE j.id = x.id
RETURNING j.id, j.state, j.task_path, j.queue, j.attempt, x.lease_owner, j.lease_version,
          x.started
"""


def reap(cursor: Cursor, *, limit: int = 500) -> list[Reaped]:
    """Take back expired leases: to `available`, `dead` when attempts are used up,
    or `cancelled` when an operator asked to cancel the job."""
    cursor.execute(REAP, {"limit": limit})
    reaped = [Reaped(*row) for row in cursor.fetchall()]
    cancel_dependents(cursor, ids=[r.id for r in reaped if r.state in UNSUCCESSFUL_STATES])
    return reaped


# The worker's row lists the jobs it may start (NULL: any it holds). It
# takes the row's lock, which REAP waits for.
DECLARE_STARTS = """
UPDATE conveyor_worker SET may_start = %(may_start)s::bigint[] WHERE id = %(owner)s
"""


def declare_starts(
    cursor: Cursor,
    *,
    owner: str,
    may_start: Sequence[int] | None,
    check: Sequence[tuple[int, int]],
) -> set[int]:
    """List the jobs `owner` may start (None: any it holds); of `check`, (id,
    version) leases claimed in earlier transactions, return the ids still held.

    Guard: a job is started only once listed (here, or by the NULL list of a
    worker that claims for its free slots only), under a lease still held
    after the list was written; REAP gives back the attempt of a job never listed.
    """
    listed = None if may_start is None else _array(tuple(may_start), quote=False) or "{}"
    cursor.execute(DECLARE_STARTS, {"owner": owner, "may_start": listed})
    # Read after the list is written (a new snapshot, after the row's lock):
    # a lease REAP took before that is not this worker's any more.
    held = [{"id": job_id, "version": version} for job_id, version in check]
    return _guarded(cursor, STILL_HELD, owner, held)


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
    -- The foreign keys cascade in Django, not in the database: delete here.
    DELETE FROM conveyor_ledger AS l USING doomed WHERE l.job_id = doomed.id
), edges_in AS (
    DELETE FROM conveyor_dependency AS d USING doomed WHERE d.job_id = doomed.id
), edges_out AS (
    DELETE FROM conveyor_dependency AS d USING doomed WHERE d.depends_on_id = doomed.id
), logs AS (
    DELETE FROM conveyor_job_log AS l USING doomed WHERE l.job_id = doomed.id
)
DELETE FROM conveyor_job AS j USING doomed WHERE j.id = doomed.id
"""


def prune(cursor: Cursor, *, older_than_seconds: float, queues: Sequence[str], limit: int) -> int:
    """Delete up to `limit` finished jobs older than the retention window."""
    cursor.execute(
        PRUNE, {"older_than": older_than_seconds, "queues": list(queues), "limit": limit}
    )
    return cursor.rowcount


# -- Operators: requeue and cancel, for the admin, the CLI, the API and code -----------------------


def _same_key(a: str, b: str) -> str:
    """SQL: jobs `a` and `b` have one unique key and window."""
    return (
        f"{a}.unique_key = {b}.unique_key AND COALESCE({a}.unique_window, {_NO_WINDOW})"
        f" = COALESCE({b}.unique_window, {_NO_WINDOW})"
    )


# A job with dependencies comes back `blocked` and REBLOCK_DEPENDENTS counts
# them. One whose dependency (policy 'cancel') is itself failed, dead or
# cancelled is refused: requeue that dependency, and this job follows. A
# unique job whose key another job holds is refused too (two jobs would hold
# one key); of requeued jobs sharing a key, only the first (lowest id) comes
# back.
REQUEUE = f"""
UPDATE conveyor_job AS j
SET state = CASE WHEN EXISTS (SELECT 1 FROM conveyor_dependency AS d WHERE d.job_id = j.id)
                      OR j.gate IS NOT NULL
                 THEN 'blocked' ELSE 'available' END,
    gate_deadline = {
    _armed_deadline(
        "j", "NOT EXISTS (SELECT 1 FROM conveyor_dependency AS d WHERE d.job_id = j.id)", "NULL"
    )
},
    attempt = 0, run_after = now(), finished_at = NULL,
    lease_expires_at = NULL, return_value = NULL, isolated = false,
    cancel_requested_at = NULL, cancel_requested_by = NULL,
    history = j.history || {_history("requeue", "'was ' || j.state")}
WHERE j.id = ANY(%(ids)s) AND j.state IN ('failed', 'dead', 'cancelled')
  AND NOT (j.dependency_policy = 'cancel' AND EXISTS (
      SELECT 1 FROM conveyor_dependency AS d JOIN conveyor_job AS p ON p.id = d.depends_on_id
      WHERE d.job_id = j.id AND p.state IN ('failed', 'dead', 'cancelled')))
  AND (j.unique_key IS NULL OR (
      NOT EXISTS (
          SELECT 1 FROM conveyor_job AS o
          WHERE o.id <> j.id AND {_same_key("o", "j")} AND {_HOLDS_KEY.format(j="o")})
      AND j.id = (
          SELECT min(c.id) FROM conveyor_job AS c
          WHERE c.id = ANY(%(ids)s) AND c.state IN ('failed', 'dead', 'cancelled')
            AND {_same_key("c", "j")})))
RETURNING j.id, j.queue
"""


NOTIFY = "SELECT pg_notify(%(channel)s, %(queue)s)"


def requeue(
    cursor: Cursor, *, ids: Sequence[int], notify: bool = True, actor: str = DEFAULT_ACTOR
) -> list[int]:
    """Give failed, dead or cancelled jobs a fresh set of attempts.

    Guard: state failed, dead or cancelled, no dependency (policy 'cancel')
    failed, dead or cancelled, and no other job holding its unique key
    (`key_holders()` names it); other ids are left alone and missing from
    the result. Clears a cancel request; notes it in history.
    A job with dependencies comes back `blocked` until they complete, and
    the dependents its failure cancelled come back too (REBLOCK_DEPENDENTS).
    """
    rows = _requeued(cursor, list(ids), actor)
    reblock_dependents(cursor, ids=[id_ for id_, _ in rows], notify=notify, actor=actor)
    if notify:
        for queue in sorted({queue for _, queue in rows}):
            cursor.execute(NOTIFY, {"channel": NOTIFY_CHANNEL, "queue": queue})
    return [id_ for id_, _ in rows]


UNIQUE_VIOLATION = "23505"  # SQLSTATE
REQUEUE_TRIES = 3


def _requeued(cursor: Cursor, ids: list[int], actor: str) -> list[tuple[int, str]]:
    """REQUEUE, again if need be. A unique key taken by a transaction that committed
    after REQUEUE's snapshot makes PostgreSQL refuse the row (unique_violation):
    REQUEUE then runs again, sees that holder, and leaves the job alone. Inside a
    transaction it runs in a savepoint, so the refusal does not end it."""
    savepoint = _in_transaction(cursor)
    for attempt in range(REQUEUE_TRIES):
        if savepoint:
            cursor.execute("SAVEPOINT conveyor_requeue")
        try:
            cursor.execute(REQUEUE, {"ids": ids, "actor": actor})
            rows = cursor.fetchall()
        except Exception as exc:
            if savepoint:
                cursor.execute("ROLLBACK TO SAVEPOINT conveyor_requeue")
            if not _is_unique_violation(exc) or attempt == REQUEUE_TRIES - 1:
                raise
            continue
        if savepoint:
            cursor.execute("RELEASE SAVEPOINT conveyor_requeue")
        return rows
    raise AssertionError("unreachable")


def _in_transaction(cursor: Cursor) -> bool:
    """Whether the cursor's connection is inside a transaction (Django's cursor or psycopg's)."""
    raw = getattr(cursor, "cursor", cursor)
    return raw.connection.info.transaction_status != pq.TransactionStatus.IDLE


def _is_unique_violation(exc: BaseException) -> bool:
    """psycopg's error, or Django's wrapper of it."""
    return UNIQUE_VIOLATION in (
        getattr(exc, "sqlstate", None),
        getattr(exc.__cause__, "sqlstate", None),
    )


# A read, for the operator's message: the job holding the unique key of each job.
KEY_HOLDERS = f"""
SELECT j.id, o.id, o.state
FROM conveyor_job AS j
JOIN conveyor_job AS o ON o.id <> j.id AND {_same_key("o", "j")} AND {_HOLDS_KEY.format(j="o")}
WHERE j.id = ANY(%(ids)s) AND j.unique_key IS NOT NULL
"""


def key_holders(cursor: Cursor, *, ids: Sequence[int]) -> dict[int, tuple[int, str]]:
    """For those of these jobs whose unique key another job holds: (its id, its state)."""
    if not ids:
        return {}
    cursor.execute(KEY_HOLDERS, {"ids": list(ids)})
    return {id_: (holder, state) for id_, holder, state in cursor.fetchall()}


_CANCELLED_ENTRY = _error_entry(
    """jsonb_build_object('exception_class_path', 'django_conveyor.exceptions.Cancelled',
        'traceback', 'Cancelled before it ran, by ' || %(actor)s::text || '.')""",
    ran=False,
)

CANCEL = f"""
UPDATE conveyor_job AS j
SET state = 'cancelled', finished_at = now(),
    errors = j.errors || {_CANCELLED_ENTRY},
    history = j.history || {_history("cancel", "'was ' || j.state")}
WHERE j.id = ANY(%(ids)s) AND j.state IN ('blocked', 'available')
RETURNING j.id
"""


def cancel(cursor: Cursor, *, ids: Sequence[int], actor: str = DEFAULT_ACTOR) -> list[int]:
    """Cancel jobs that have not started (blocked or available).

    Guard: state blocked or available; others are missing from the result.
    """
    cursor.execute(CANCEL, {"ids": list(ids), "actor": actor})
    cancelled = [row[0] for row in cursor.fetchall()]
    cancel_dependents(cursor, ids=cancelled)
    return cancelled


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


def request_cancel(cursor: Cursor, *, ids: Sequence[int], actor: str = DEFAULT_ACTOR) -> list[int]:
    """Ask the workers holding these running jobs to stop them; no state changes.

    Guard: state running and no earlier request; any token. Zero rows means
    the job is not running (any more) or was already asked to stop.
    """
    cursor.execute(REQUEST_CANCEL, {"ids": list(ids), "actor": actor})
    return [row[0] for row in cursor.fetchall()]


# -- Workflows: dependents settled in the transaction of their dependency's end --------------------


_DEPENDENTS_OF = f"WITH {_dependents_of('= ANY(%(ids)s)')}"


UNBLOCK = f"""{_DEPENDENTS_OF}
{_unblocked()}
"""


def unblock(cursor: Cursor, *, ids: Iterable[int], notify: bool = True) -> list[int]:
    """Count these completed jobs off their blocked dependents; returns those now available.

    Guard: the dependent is blocked (under its row lock). Call it only in the
    transaction of the fenced COMPLETE, with the ids that COMPLETE wrote.
    Zero rows: nothing waited for these jobs.
    """
    ids = sorted(ids)
    if not ids:
        return []
    cursor.execute(UNBLOCK, {"ids": ids, "notify": notify, "channel": NOTIFY_CHANNEL})
    return [id_ for id_, state, _ in cursor.fetchall() if state == "available"]


DEPENDENCY_FAILED = "django_conveyor.exceptions.DependencyFailed"


_DEPENDENCY_FAILED_ENTRY = _error_entry(
    f"""jsonb_build_object('exception_class_path', '{DEPENDENCY_FAILED}',
            'traceback', 'Dependency ' || e.id || ' (' || e.task_path || ') ended '
                || e.state || '; this job was cancelled without running.',
            'dependency', e.id)""",
    ran=False,
)

CANCEL_DEPENDENTS = f"""{_DEPENDENTS_OF}
UPDATE conveyor_job AS j
SET state = CASE WHEN j.dependency_policy = 'cancel' THEN 'cancelled'
                 WHEN j.pending_dependencies - locked.n > 0 OR j.gate IS NOT NULL THEN 'blocked'
                 ELSE 'available' END,
    gate_deadline = {
    _armed_deadline(
        "j", "j.dependency_policy = 'run' AND j.pending_dependencies - locked.n <= 0", "NULL"
    )
},
    pending_dependencies = CASE WHEN j.dependency_policy = 'cancel' THEN j.pending_dependencies
                                ELSE j.pending_dependencies - locked.n END,
    finished_at = CASE WHEN j.dependency_policy = 'cancel' THEN now() END,
    run_after = CASE WHEN j.dependency_policy = 'run' AND j.pending_dependencies - locked.n <= 0
                     THEN greatest(j.run_after, now()) ELSE j.run_after END,
    errors = CASE WHEN j.dependency_policy = 'run' THEN j.errors
        ELSE j.errors || {_DEPENDENCY_FAILED_ENTRY} END
FROM locked JOIN conveyor_job AS e ON e.id = locked.first
WHERE j.id = locked.id
RETURNING j.id, j.state, {_NOTIFY_AVAILABLE}
"""


def cancel_dependents(cursor: Cursor, *, ids: Iterable[int], notify: bool = True) -> list[int]:
    """These jobs ended failed, dead or cancelled: settle their blocked dependents.

    Policy 'cancel': `cancelled`, with an error naming the dependency, and so
    on down the graph (one statement per level). Policy 'run': decremented,
    `available` at 0. Guard: the dependent is blocked. Returns the ids
    cancelled; zero rows means nothing waited for these jobs.
    """
    cancelled: list[int] = []
    frontier = sorted(ids)
    while frontier:
        cursor.execute(
            CANCEL_DEPENDENTS, {"ids": frontier, "notify": notify, "channel": NOTIFY_CHANNEL}
        )
        frontier = sorted(id_ for id_, state, _ in cursor.fetchall() if state == "cancelled")
        cancelled += frontier
    return cancelled


# The candidates: the given jobs that REQUEUE made blocked, and their
# dependents that a dependency's failure cancelled (the last error says so;
# an operator's cancel leaves another) or that have policy 'run' and have not
# started (their dependency is unfinished again). Their
# dependencies are share-locked before the candidates are locked (a
# dependency before its dependents, as COMPLETE then UNBLOCK do), so the
# counts read the latest committed states and nothing changes them before
# this commits. A job cancelled by a dependency stays cancelled while another
# of its dependencies is failed, dead or cancelled.
REBLOCK_DEPENDENTS = f"""
WITH candidates AS (
    SELECT j.id FROM conveyor_job AS j WHERE j.id = ANY(%(ids)s) AND j.state = 'blocked'
    UNION
    SELECT j.id
    FROM conveyor_dependency AS d JOIN conveyor_job AS j ON j.id = d.job_id
    WHERE d.depends_on_id = ANY(%(ids)s)
      AND ((j.state IN ('blocked', 'available') AND j.dependency_policy = 'run')
           OR (j.state = 'cancelled'
               AND j.errors -> -1 ->> 'exception_class_path' = '{DEPENDENCY_FAILED}'))
), upstream AS (
    SELECT d.job_id, p.state
    FROM candidates AS c
    JOIN conveyor_dependency AS d ON d.job_id = c.id
    JOIN conveyor_job AS p ON p.id = d.depends_on_id
    ORDER BY p.id
    FOR SHARE OF p
), counted AS (
    SELECT job_id,
           count(*) FILTER (WHERE state <> 'completed') AS unfinished,
           count(*) FILTER (
               WHERE state NOT IN ('completed', 'failed', 'dead', 'cancelled')) AS unsettled
    FROM upstream GROUP BY job_id
), locked AS (
    SELECT j.id, c.unfinished, c.unsettled
    FROM conveyor_job AS j JOIN counted AS c ON j.id = c.job_id
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE conveyor_job AS j
SET pending_dependencies = CASE WHEN j.dependency_policy = 'run' THEN locked.unsettled
                                ELSE locked.unfinished END,
    state = CASE WHEN (CASE WHEN j.dependency_policy = 'run' THEN locked.unsettled
                            ELSE locked.unfinished END) > 0 OR j.gate IS NOT NULL
                 THEN 'blocked' ELSE 'available' END,
    gate_deadline = {
    _armed_deadline(
        "j",
        '''(CASE WHEN j.dependency_policy = 'run'
        THEN locked.unsettled ELSE locked.unfinished END) = 0''',
        "NULL",
    )
},
    finished_at = NULL,
    run_after = greatest(j.run_after, now()),
    history = CASE WHEN j.state = 'blocked' THEN j.history ELSE j.history || jsonb_build_array(
        jsonb_build_object('time', now(), 'actor', %(actor)s::text, 'action', 'reblock',
                           'detail', 'a dependency was requeued, was ' || j.state)) END
FROM locked
WHERE j.id = locked.id
  AND (j.state = 'blocked' OR (j.state = 'available' AND j.dependency_policy = 'run')
       OR (j.state = 'cancelled' AND (j.dependency_policy = 'run'
           OR locked.unfinished = locked.unsettled)))
RETURNING j.id, j.state, {_NOTIFY_AVAILABLE}
"""


def reblock_dependents(
    cursor: Cursor, *, ids: Iterable[int], notify: bool = True, actor: str = DEFAULT_ACTOR
) -> list[int]:
    """These jobs were requeued: count their dependencies, and bring back their dependents.

    A requeued job that came back `blocked` gets its counter; a dependent
    that a dependency's failure cancelled returns to `blocked` (or
    `available`) with its counter recomputed, unless another dependency is
    still failed, dead or cancelled; and so on down the graph. A dependent
    with policy 'run' that has not started is recounted, and waits again
    (its dependency is unfinished again). Returns the dependents brought back.
    """
    frontier = sorted(ids)
    requeued = set(frontier)
    back: list[int] = []
    while frontier:
        cursor.execute(
            REBLOCK_DEPENDENTS,
            {"ids": frontier, "notify": notify, "channel": NOTIFY_CHANNEL, "actor": actor},
        )
        frontier = sorted(id_ for id_, _, _ in cursor.fetchall() if id_ not in requeued)
        requeued |= set(frontier)
        back += frontier
    return back


# -- Gates: waits that end by a signal, a row condition or the clock; checkpoints ------------------


# A gate waits while it is blocked with its upstream done. Each statement
# that ends the wait (SIGNAL, CONDITION_MET, GATE_TIMEOUT) is guarded by it
# under the gate's row lock, so the first to come ends it and the others
# match no row: a gate's wait ends once.
_GATE_WAITS = "j.state = 'blocked' AND j.pending_dependencies = 0"


def _gate_error_entry(exception: str, text: str) -> str:
    """A gate's entry in `errors` (`exception` in django_conveyor.exceptions): it never ran."""
    return _error_entry(
        f"""jsonb_build_object('exception_class_path', 'django_conveyor.exceptions.{exception}',
            'traceback', {text})""",
        ran=False,
    )


_SIGNAL_REJECTED_ENTRY = _gate_error_entry(
    "SignalRejected",
    "'The signal ' || (j.gate ->> 'signal') || ' was rejected by ' || %(actor)s::text"
    " || COALESCE(': ' || %(reason)s::text, '.')",
)

SIGNAL = f"""
UPDATE conveyor_job AS j
SET state = CASE WHEN %(reject)s THEN 'failed' ELSE 'completed' END,
    return_value = CASE WHEN %(reject)s THEN NULL ELSE %(payload)s::jsonb END,
    finished_at = now(), gate_deadline = NULL,
    errors = CASE WHEN %(reject)s THEN j.errors || {_SIGNAL_REJECTED_ENTRY} ELSE j.errors END,
    history = j.history || {
    _history(
        "signal", "CASE WHEN %(reject)s THEN 'rejected ' ELSE 'sent ' END || (j.gate ->> 'signal')"
    )
}
WHERE j.id = %(id)s AND {_GATE_WAITS}
  AND j.gate ->> 'kind' = 'signal' AND j.gate ->> 'signal' = %(name)s
RETURNING j.id, j.state
"""


def signal(
    cursor: Cursor,
    *,
    gate_id: int,
    name: str,
    payload: str | None,
    reject: bool = False,
    reason: str | None = None,
    actor: str = DEFAULT_ACTOR,
) -> str | None:
    """End a signal gate's wait: completed with `payload` (JSON text), or failed (rejected).

    Guard: the gate waits (blocked, its upstream done) for the signal `name`.
    Its dependents are unblocked (or settled, on a rejection) in the same
    transaction. Returns the gate's new state; None (zero rows) means it does
    not wait for this signal now (`gate_state` tells why); nothing changed.
    """
    cursor.execute(
        SIGNAL,
        {"id": gate_id, "name": name, "payload": payload, "reject": reject, "reason": reason,
         "actor": actor},
    )  # fmt: skip
    rows = cursor.fetchall()
    if not rows:
        return None
    state = rows[0][1]
    if state == "completed":
        unblock(cursor, ids=[gate_id])
    else:
        cancel_dependents(cursor, ids=[gate_id])
    return state


# A plain read after a SIGNAL that matched no row, to say why.
GATE_STATE = "SELECT state, pending_dependencies, gate FROM conveyor_job WHERE id = %(id)s"


def gate_state(cursor: Cursor, *, gate_id: int) -> tuple[str, int, Any] | None:
    """A job's state, pending count and gate definition (None: no such job).

    The definition is a dict, None (not a gate) or `Unreadable` (a row written by hand).
    """
    cursor.execute(GATE_STATE, {"id": gate_id})
    rows = fetch_all(cursor)
    if not rows:
        return None
    state, pending, gate = rows[0]
    return state, pending, loads_or_unreadable(gate, "gate")


# The waiting condition gates in id order, after the last one checked
# (conveyor_job_gate_waiting_idx), or the ones named; locked, so that the
# CONDITION_MET of what their check found is theirs alone.
WAITING_CONDITIONS = """
SELECT id, gate FROM conveyor_job
WHERE state = 'blocked' AND gate IS NOT NULL AND (gate ->> 'kind') = 'condition'
  AND pending_dependencies = 0 AND id > %(after)s
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""


def waiting_conditions(
    cursor: Cursor, *, after: int, limit: int, ids: Sequence[int] | None = None
) -> list[tuple[int, Any]]:
    """Lock up to `limit` waiting condition gates after `after` (or of `ids`): (id, condition).

    Rows another transaction holds are skipped: a later pass checks them.
    """
    cursor.execute(
        WAITING_CONDITIONS,
        {"after": after, "limit": limit, "ids": list(ids) if ids is not None else None},
    )
    return [(gate_id, _condition(gate)) for gate_id, gate in fetch_all(cursor)]


def _condition(gate: Any) -> Any:
    """A gate's stored condition, or `Unreadable` (a row written by hand): its gate fails alone."""
    loaded_gate = loads_or_unreadable(gate, "gate")
    return loaded_gate if isinstance(loaded_gate, Unreadable) else loaded_gate["condition"]


_CONDITION_INVALID_ENTRY = _gate_error_entry("ConditionInvalid", "h.error")

# The gates service checked these conditions under the gates' row locks: a
# row matched (its pk is the result), or the condition could not be evaluated.
CONDITION_MET = f"""
UPDATE conveyor_job AS j
SET state = CASE WHEN h.error IS NULL THEN 'completed' ELSE 'failed' END,
    return_value = CASE WHEN h.error IS NULL THEN jsonb_build_object('matched', h.matched) END,
    finished_at = now(), gate_deadline = NULL,
    errors = CASE WHEN h.error IS NULL THEN j.errors ELSE j.errors || {_CONDITION_INVALID_ENTRY} END
FROM jsonb_to_recordset(%(rows)s::jsonb) AS h(id bigint, matched jsonb, error text)
WHERE j.id = h.id AND {_GATE_WAITS} AND j.gate ->> 'kind' = 'condition'
RETURNING j.id, j.state
"""


def condition_met(cursor: Cursor, *, rows: Iterable[dict[str, Any]]) -> dict[int, str]:
    """End condition gates: completed with `matched`, or failed with `error` (text).

    Guard: the gate waits and is a condition. Call it under the gates' row
    locks (`waiting_conditions` takes them before the check). Returns the new
    state of each gate ended; a gate missing from it no longer waits.
    """
    rows = list(rows)
    if not rows:
        return {}
    cursor.execute(CONDITION_MET, {"rows": _json(rows)})
    states = dict(cursor.fetchall())
    unblock(cursor, ids=[i for i, state in states.items() if state == "completed"])
    cancel_dependents(cursor, ids=[i for i, state in states.items() if state == "failed"])
    return states


class GateEnded(NamedTuple):
    id: int
    state: str  # completed or failed.
    task_path: str
    queue: str


_ENDS_WELL = "(j.gate ->> 'kind' = 'sleep' OR j.gate ->> 'on_timeout' = 'continue')"

_GATE_TIMED_OUT_ENTRY = _gate_error_entry(
    "GateTimedOut",
    "'The gate timed out at ' || j.gate_deadline || ' without its '"
    " || COALESCE('signal ' || (j.gate ->> 'signal'), 'condition') || '.'",
)

# Due gates through conveyor_job_gate_due_idx, on the database's clock. A
# timer completes; a timeout completes with the marker ('continue') or fails.
# SKIP LOCKED: a gate a signal holds is left to it (it ends the wait first).
GATE_TIMEOUT = f"""
WITH due AS (
    SELECT id FROM conveyor_job
    WHERE state = 'blocked' AND gate_deadline <= now()
    ORDER BY gate_deadline
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE conveyor_job AS j
SET state = CASE WHEN {_ENDS_WELL} THEN 'completed' ELSE 'failed' END,
    return_value = CASE
        WHEN j.gate ->> 'kind' = 'sleep' THEN jsonb_build_object('slept_until', j.gate_deadline)
        WHEN j.gate ->> 'on_timeout' = 'continue'
        THEN jsonb_build_object('timed_out', true, 'deadline', j.gate_deadline) END,
    finished_at = now(), gate_deadline = NULL,
    errors = CASE WHEN {_ENDS_WELL} THEN j.errors ELSE j.errors || {_GATE_TIMED_OUT_ENTRY} END
FROM due
WHERE j.id = due.id AND {_GATE_WAITS}
RETURNING j.id, j.state, j.task_path, j.queue
"""


def gate_timeout(cursor: Cursor, *, limit: int = 500) -> list[GateEnded]:
    """End up to `limit` gates whose deadline passed (timers, timeouts).

    Guard: the gate waits and `gate_deadline <= now()`; rows locked by
    another transaction are skipped. Dependents follow in the same transaction.
    """
    cursor.execute(GATE_TIMEOUT, {"limit": limit})
    ended = [GateEnded(*row) for row in cursor.fetchall()]
    unblock(cursor, ids=[g.id for g in ended if g.state == "completed"])
    cancel_dependents(cursor, ids=[g.id for g in ended if g.state == "failed"])
    return ended


# A resumable step's record, inside the attempt's guarded transaction (after
# LOCK_FOR_EFFECT), fenced itself: a stale token inserts nothing. The unique
# (job, effect key) keeps one record per step.
CHECKPOINT = """
INSERT INTO conveyor_ledger (job_id, effect_key, lease_version, worker, applied_at, value)
SELECT j.id, %(key)s, j.lease_version, j.lease_owner, now(), %(value)s::jsonb
FROM conveyor_job AS j
WHERE j.id = %(id)s AND j.state = 'running'
  AND j.lease_owner = %(owner)s AND j.lease_version = %(version)s
ON CONFLICT (job_id, effect_key) DO NOTHING
RETURNING id
"""


def checkpoint(
    cursor: Cursor, *, job_id: int, owner: str, version: int, key: str, value: str | None
) -> bool:
    """Record a step's value (JSON text) under the token; call it under LOCK_FOR_EFFECT.

    False: the token does not hold the job, or the step is already recorded.
    """
    cursor.execute(
        CHECKPOINT, {"id": job_id, "owner": owner, "version": version, "key": key, "value": value}
    )
    return bool(cursor.fetchall())


RECORDED_STEP = "SELECT value FROM conveyor_ledger WHERE job_id = %(id)s AND effect_key = %(key)s"


def recorded_step(cursor: Cursor, *, job_id: int, key: str) -> tuple[bool, Any]:
    """(True, value) when the job's step `key` is recorded, else (False, None)."""
    cursor.execute(RECORDED_STEP, {"id": job_id, "key": key})
    rows = cursor.fetchall()
    return (True, loaded(rows[0][0])) if rows else (False, None)


# -- Cron: one tick of a periodic schedule ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CronTick:
    job_id: int | None  # The tick's job: new, or the one its key already named.
    created: bool  # False when the tick's key already named a job.


def cron_key(name: str, tick: datetime) -> str:
    """The idempotency key of one tick: `cron:<schedule name>:<tick in UTC, ISO 8601>`."""
    return f"cron:{name}:{tick.astimezone(UTC).replace(tzinfo=None).isoformat()}Z"


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
        run_after, enqueued_run_after, lease_version, idempotency_key, errors, enqueued_at,
        tags, meta
    )
    SELECT %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(queue)s, %(backend)s,
           %(priority)s, 'available', 0, %(max_attempts)s, %(tick)s, %(tick)s, 0, %(key)s,
           '[]'::jsonb, now(),
           %(tags)s::jsonb, %(meta)s::jsonb
    FROM due
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
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
            "tags": _json(list(job.tags)) if job.tags else None,
            "meta": _json(job.meta) if job.meta else None,
            "notify": notify,
            "channel": NOTIFY_CHANNEL,
        },
    )
    rows = cursor.fetchall()
    return CronTick(rows[0][0], bool(rows[0][1])) if rows else None


ACTIONS = {
    "ENQUEUE": enqueue,
    "CLAIM": claim,
    "CLAIM_ISOLATED": claim_isolated,
    "DECLARE_STARTS": declare_starts,
    "CLAIM_LIMITED": claim_limited,
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
    "PRUNE": prune,
    "REQUEST_CANCEL": request_cancel,
    "CANCEL_HELD": cancel_held,
    "CRON_ENQUEUE": cron_enqueue,
    "UNBLOCK": unblock,
    "CANCEL_DEPENDENTS": cancel_dependents,
    "REBLOCK_DEPENDENTS": reblock_dependents,
    "SIGNAL": signal,
    "CONDITION_MET": condition_met,
    "GATE_TIMEOUT": gate_timeout,
    "CHECKPOINT": checkpoint,
    "HEARTBEAT_PROGRESS": heartbeat_progress,
    "ENQUEUE_REPLACE": enqueue_replace,
}

# Statements that are another text of an action above: the same rows written,
# the same guard, for another shape of input or another index to read
# (tests/test_enqueue_forms.py, tests/test_plans.py's merged claim).
FORMS = {"ENQUEUE_ONE": "ENQUEUE", "CLAIM_MERGED": "CLAIM"}


__all__ = ["ACTIONS", "GateEnded", "JobState", "Lease", "NewJob", "Reaped", "Renewed"]
