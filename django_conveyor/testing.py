"""Helpers for your own test suite: what was enqueued, and running it in-process.

    from django_conveyor import testing

    testing.assert_enqueued(send_receipt, args=[order.pk], queue="emails")
    ran = testing.run_jobs()                 # every job ready now, once
    with testing.run_enqueued() as ran:      # on exit: run jobs until none is ready
        place_order(...)

Jobs run in the calling thread, on the test's own database connection, so
they see the test's uncommitted rows (Django's `TestCase`, pytest-django's
`db`) as well as committed ones (`TransactionTestCase`, `transactional_db`).
They go through the worker's own path: `CLAIM` under a fencing token, the
handler (with `context.atomic()` as a savepoint of the test's transaction),
the fenced outcome statement, retries with their backoff, and the
`task_started` / `task_finished` signals. What a test does not get is what
needs time or processes: no heartbeat, no reaper, no `timeout`. Within a
`TestCase` the database clock (`now()`) stands still, so a retry waits for
its backoff forever unless `immediate_retries=True` makes it due at once.

With pytest, add `pytest_plugins = ["django_conveyor.testing"]` to a
conftest.py for the `conveyor` fixture (these helpers as one object); in a
`TestCase`, mix in `ConveyorAssertions` for `assertEnqueued()`.
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction
from psycopg.pq import TransactionStatus

from . import protocol
from .compat import Task
from .conf import conveyor_settings
from .models import Job
from .results import ConveyorTaskResult, result_from_job, result_id
from .serialization import json_round_trip, loaded
from .states import JobState
from .worker import attempts, outcomes
from .worker.attempts import Attempt
from .worker.handlers import executor, reporting

__all__ = [
    "Conveyor",
    "ConveyorAssertions",
    "Ran",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued",
    "run_enqueued",
    "run_jobs",
]

WAITING = (JobState.BLOCKED, JobState.AVAILABLE)  # Enqueued and not yet run (or run again).
MAX_JOBS = 1000  # run_jobs() stops after this many attempts: a job that enqueues itself.
CLAIM_LIMIT = 500  # Jobs claimed at once; every job ready at that instant, in practice.


@dataclass
class Ran:
    """What a run did: each attempt's job id and what became of it, in run order."""

    attempts: list[tuple[str, str]] = field(default_factory=list)  # (result id, outcome)

    def count(self, outcome: str) -> int:
        return sum(1 for _, became in self.attempts if became == outcome)

    @property
    def counts(self) -> Counter[str]:
        """completed, retried, dead, failed, snoozed, cancelled, refused: how many of each."""
        return Counter(became for _, became in self.attempts)

    @property
    def completed(self) -> int:
        return self.count("completed")

    @property
    def retried(self) -> int:
        return self.count("retried")

    @property
    def failed(self) -> int:
        """Attempts that ended the job failed or dead."""
        return self.count("failed") + self.count("dead")

    def __len__(self) -> int:
        return len(self.attempts)


def enqueued(
    task: Task | str | None = None,
    *,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> list[ConveyorTaskResult]:
    """Jobs waiting to run (available or blocked) that match, oldest first.

    `task` is a task or its dotted path; `args` and `kwargs` match the
    JSON-stored values, so a tuple matches a list. Rows of the current test's
    transaction count too.
    """
    wanted = {}
    if task is not None:
        wanted["task_path"] = task if isinstance(task, str) else task.module_path
    if args is not None:
        wanted["args"] = json_round_trip(list(args), "args")
    if kwargs is not None:
        wanted["kwargs"] = json_round_trip(dict(kwargs), "kwargs")
    if queue is not None:
        wanted["queue"] = queue
    if priority is not None:
        wanted["priority"] = priority
    found = []
    for database in conveyor_settings().databases():
        rows = Job.objects.using(database).filter(state__in=WAITING, **wanted)
        found += [
            (job.enqueued_at, job.id, result_from_job(job, database=database)) for job in rows
        ]
    # Within a test's transaction every enqueued_at is the same instant: then by id.
    return [result for _, _, result in sorted(found, key=lambda f: (f[0], f[1]))]


def assert_enqueued(
    task: Task | str,
    *,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
    count: int | None = None,
) -> ConveyorTaskResult:
    """Fail unless a matching job waits to run (exactly `count`, if given); return the first."""
    found = enqueued(task, args=args, kwargs=kwargs, queue=queue, priority=priority)
    if (count is None and not found) or (count is not None and len(found) != count):
        asked = _describe(task, args=args, kwargs=kwargs, queue=queue, priority=priority)
        expected = "a job" if count is None else f"{count} job(s)"
        raise AssertionError(
            f"Expected {expected} matching {asked} waiting to run, found {len(found)}. "
            f"Waiting: {_listing(enqueued())}."
        )
    return found[0] if found else None  # type: ignore[return-value]


def assert_not_enqueued(
    task: Task | str | None = None,
    *,
    args: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> None:
    """Fail if a matching job waits to run (with no filters: if any job does)."""
    found = enqueued(task, args=args, kwargs=kwargs, queue=queue, priority=priority)
    if found:
        asked = _describe(task, args=args, kwargs=kwargs, queue=queue, priority=priority)
        raise AssertionError(f"Expected no job matching {asked}, found {_listing(found)}.")


def run_jobs(
    *,
    queues: Sequence[str] | None = None,
    until_empty: bool = False,
    immediate_retries: bool = False,
    max_jobs: int = MAX_JOBS,
) -> Ran:
    """Run the jobs that are ready, in this thread, through the worker's protocol.

    Every job ready when it is called runs once, in claim order (priority,
    then due time). With `until_empty`, it claims again until nothing is
    ready: jobs that handlers enqueued and retries that are due run too.
    `immediate_retries` makes a retry or a snooze due at once instead of
    after its delay (inside a `TestCase`, time does not pass otherwise).
    Stops with an AssertionError after `max_jobs` attempts.
    """
    ran = Ran()
    owner = f"testing:{socket.gethostname()[:40]}:{os.getpid()}"
    while True:
        claimed = 0
        for database in conveyor_settings().databases():
            for lease in _claim(database, owner, queues):
                claimed += 1
                if len(ran) >= max_jobs:
                    raise AssertionError(
                        f"run_jobs() ran {max_jobs} attempts and jobs are still ready: "
                        "does a job enqueue itself, or retry for ever?"
                    )
                _run(Attempt(lease, database), owner, ran, immediate_retries=immediate_retries)
        if not claimed or not until_empty:
            return ran


@contextmanager
def run_enqueued(
    *, queues: Sequence[str] | None = None, immediate_retries: bool = False
) -> Iterator[Ran]:
    """On leaving the block, run jobs until none is ready; the `Ran` is filled then."""
    ran = Ran()
    yield ran
    done = run_jobs(queues=queues, until_empty=True, immediate_retries=immediate_retries)
    ran.attempts.extend(done.attempts)


def _claim(database: str, owner: str, queues: Sequence[str] | None) -> list[protocol.Lease]:
    if queues is None:  # Every queue that has a job waiting.
        queues = list(
            Job.objects.using(database)
            .filter(state=JobState.AVAILABLE)
            .values_list("queue", flat=True)
            .distinct()
        )
        if not queues:
            return []
    with connections[database].cursor() as cursor:
        leases = protocol.claim(
            cursor,
            owner=owner,
            queues=queues,
            limit=CLAIM_LIMIT,
            lease_seconds=conveyor_settings().LEASE_SECONDS,
        )
    # Django's cursors hand jsonb over as text; the worker's own connection decodes it.
    return [
        lease._replace(
            args=loaded(lease.args),
            kwargs=loaded(lease.kwargs),
            errors=loaded(lease.errors),
        )
        for lease in leases
    ]


class _RolledBack(Exception):
    """Rolls the handler's savepoint back (see _run)."""


def _run(attempt: Attempt, owner: str, ran: Ran, *, immediate_retries: bool) -> None:
    connection = connections[attempt.database]
    attempt.started_at = time.monotonic()  # As a slot does: the attempt started.
    if not connection.in_atomic_block:  # TransactionTestCase: as in a worker.
        outcome = executor.execute(attempt)
    else:
        # A handler's failed statement aborts the test's transaction (a worker's
        # handler has a connection of its own): roll back to before the handler,
        # so that the outcome can be written and the test go on.
        try:
            with transaction.atomic(using=attempt.database):
                # The blocks around the handler are the test's: context.atomic() nests in them.
                attempt.outer_atomic_blocks = len(connection.atomic_blocks)
                outcome = executor.execute(attempt)
                if _aborted(connection):
                    raise _RolledBack
        except _RolledBack:
            pass
    if immediate_retries and outcome.kind in (attempts.RETRY, attempts.SNOOZE):
        outcome.delay = 0.0
    with connection.cursor() as cursor:
        written = outcomes.write(cursor, owner, outcomes.by_kind([outcome]))
    became = written.get(attempt.lease.id)
    ran.attempts.append((result_id(attempt.database, attempt.lease.id), became or "refused"))
    if became is not None:
        reporting.report(outcome)


def _aborted(connection: Any) -> bool:
    raw = connection.connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.INERROR


def _describe(task: Task | str | None, **filters: Any) -> str:
    name = task if isinstance(task, str) or task is None else task.module_path
    parts = [f"task={name}"] if name else []
    parts += [f"{k}={v!r}" for k, v in filters.items() if v is not None]
    return ", ".join(parts) or "anything"


def _listing(results: list[ConveyorTaskResult]) -> str:
    if not results:
        return "none"
    return "; ".join(
        f"{r.task.module_path}(args={r.args!r}, kwargs={r.kwargs!r}) "
        f"queue={r.task.queue_name} priority={r.task.priority}"
        for r in results
    )


class Conveyor:
    """The helpers as one object: the pytest fixture `conveyor`."""

    enqueued = staticmethod(enqueued)
    assert_enqueued = staticmethod(assert_enqueued)
    assert_not_enqueued = staticmethod(assert_not_enqueued)
    run_jobs = staticmethod(run_jobs)
    run_enqueued = staticmethod(run_enqueued)


class ConveyorAssertions:
    """Mix into a Django `TestCase` or `TransactionTestCase` for Django-style assertions."""

    def assertEnqueued(self, task: Task | str, **filters: Any) -> ConveyorTaskResult:
        return assert_enqueued(task, **filters)

    def assertNotEnqueued(self, task: Task | str | None = None, **filters: Any) -> None:
        assert_not_enqueued(task, **filters)


try:
    import pytest
except ImportError:  # pytest is optional: the helpers above work without it.
    pass
else:

    @pytest.fixture
    def conveyor() -> Conveyor:
        """These helpers (needs database access: pytest-django's `db` or `transactional_db`)."""
        return Conveyor()
