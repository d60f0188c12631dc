"""`ConveyorBackend`: the django.tasks backend over `conveyor_job`.

Enqueue runs on the caller's database connection, so it commits or rolls
back with the caller's transaction; its NOTIFY is delivered only on commit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
from django.apps import apps
from django.core import checks
from django.db import connections, transaction
from django.utils import timezone

from . import protocol
from .bounds import (
    EARLIEST_INSTANT,
    LATEST_INSTANT,
    MAX_INT,
    MAX_SECONDS,
    count_breach,
    instant_breach,
    is_count,
    is_number,
    seconds_breach,
)
from .collector import collector_paused
from .compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    TaskResultDoesNotExist,
    log_task_enqueued,
    task_enqueued,
)
from .conf import conveyor_settings, not_postgresql
from .exceptions import ConveyorConfigurationError, DependencyInOtherDatabase
from .observability import tracing
from .observability.labels import meta_problem, tags_problem
from .results import ConveyorTaskResult, parse_result_id, result_from_job, result_id, task_result
from .serialization import json_round_trip, text_problem
from .signals import heard, task_enqueue_replayed
from .tasks import DEPENDENCY_POLICIES, ConveyorTask
from .unique import Unique, unique_call

logger = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_CONCURRENCY_KEY_LENGTH = 255  # conveyor_job.concurrency_key
# What one call of enqueue_many() may set.
PER_CALL_OPTIONS = ("idempotency_key", "unique", "concurrency_key")
# Folding the call into another job would drop the dependencies it asked for.
UNIQUE_WITH_DEPENDENCIES = (
    "A unique job cannot wait for dependencies: {name}() has unique=Unique(...), and a call "
    "folded into an existing job would lose its depends_on. In a workflow, give the steps "
    "after the first .using(unique=False)."
)


def run_after_problem(run_after: Any) -> str | None:
    """What is wrong with a `run_after` (a sentence naming it), or None.

    A datetime is accepted up to ten years from now (bounds.MAX_SECONDS),
    and only as an instant Python can show in every time zone
    (bounds.instant_breach): PostgreSQL would store more, which no worker,
    page or `get_result()` could read back.
    """
    if run_after is None:
        return None
    if not isinstance(run_after, datetime):
        hint = (
            " Parse it first, for example with datetime.fromisoformat()."
            if isinstance(run_after, str)
            else " Add a timedelta to timezone.now() instead."
            if isinstance(run_after, timedelta | int | float)
            else ""
        )
        kind = type(run_after).__name__
        return f"run_after must be a datetime, not {kind} {run_after!r:.80}.{hint}"
    # A naive one is local time (django.tasks refuses it when USE_TZ).
    if instant_breach(run_after, naive_zone=timezone.get_default_timezone()):
        return (
            f"run_after {run_after.isoformat()} must be an instant between "
            f"{EARLIEST_INSTANT.date().isoformat()} and {LATEST_INSTANT:%Y-%m-%d} UTC: Python "
            "cannot show it in every time zone, so no worker or page could read it back."
        )
    now = datetime.now() if timezone.is_naive(run_after) else timezone.now()
    if run_after > now + timedelta(seconds=MAX_SECONDS):
        return (
            f"run_after must be at most {MAX_SECONDS:.0f} seconds (ten years) from now, "
            f"not {run_after.isoformat()}."
        )
    return None


def _traced(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """`meta` with the active span's trace context, when tracing is on ([otel])."""
    return tracing.inject(meta) if tracing.enabled() else meta


class ConveyorBackend(BaseTaskBackend):
    task_class = ConveyorTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def validate_task(self, task: Any) -> None:
        """Refuse, before anything is written, what PostgreSQL or the worker could not hold.

        Each message names the option and what is wrong with it; the types are
        checked first, so that django.tasks' own checks never meet a value
        they cannot compare (a str run_after, a bool priority).
        """
        priority = task.priority
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidTask(
                f"priority must be a whole number from {TASK_MIN_PRIORITY} to "
                f"{TASK_MAX_PRIORITY}, not {type(priority).__name__} {priority!r:.40}."
            )
        if problem := run_after_problem(task.run_after):
            raise InvalidTask(problem)
        if isinstance(task.queue_name, str) and (problem := text_problem(task.queue_name)):
            raise InvalidTask(f"queue_name {task.queue_name!r:.80} {problem}.")
        super().validate_task(task)
        max_attempts = getattr(task, "max_attempts", None)
        if max_attempts is not None and (not is_count(max_attempts) or count_breach(max_attempts)):
            raise InvalidTask(
                f"max_attempts must be a whole number from 1 to {MAX_INT}, not {max_attempts!r}."
            )
        for name in ("timeout", "backoff_base", "backoff_cap"):
            value = getattr(task, name, None)
            if value is not None and (not is_number(value) or seconds_breach(value)):
                raise InvalidTask(
                    f"{name} must be a positive number of seconds, at most {MAX_SECONDS:.0f} "
                    f"(ten years), not {value!r}."
                )
        policy = getattr(task, "dependency_policy", "cancel")
        if policy not in DEPENDENCY_POLICIES:
            raise InvalidTask(
                f"dependency_policy must be one of {', '.join(map(repr, DEPENDENCY_POLICIES))}, "
                f"not {policy!r:.80}."
            )
        key = getattr(task, "idempotency_key", None)
        if key is not None and (
            not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY_LENGTH
        ):
            raise InvalidTask(
                f"idempotency_key must be a non-empty string of at most "
                f"{MAX_IDEMPOTENCY_KEY_LENGTH} characters, not {key!r:.80}."
            )
        if key is not None and (problem := text_problem(key)):
            raise InvalidTask(f"idempotency_key {key!r:.80} {problem}.")
        if problem := tags_problem(getattr(task, "tags", ())):
            raise InvalidTask(problem)
        concurrency_key = getattr(task, "concurrency_key", None)
        if not callable(concurrency_key) and (problem := concurrency_key_problem(concurrency_key)):
            raise InvalidTask(problem)
        meta = getattr(task, "meta", None)
        if meta is not None and (problem := meta_problem(meta)):
            raise InvalidTask(problem)
        unique = getattr(task, "unique", None)
        if unique is not None and not isinstance(unique, Unique):
            raise InvalidTask(
                f"unique must be a Unique(...) (or False for none), not "
                f"{type(unique).__name__} {unique!r:.80}."
            )
        if unique is not None and getattr(task, "depends_on", ()):
            raise InvalidTask(UNIQUE_WITH_DEPENDENCIES.format(name=task.name))

    def new_job(
        self, task: Any, args: Sequence[Any], kwargs: dict[str, Any], after: Sequence[int] = ()
    ) -> protocol.NewJob:
        """The row one call writes, its arguments checked; `after` adds job ids to wait for.

        The shared enqueue path is `new_job()` then `enqueue_jobs()`: `enqueue()`
        takes it, and so does a workflow (workflows/), which adds its edges
        between the two. Call `validate_task()` first.
        """
        return self.job_maker(task, after)(args, kwargs)

    def job_maker(
        self, task: Any, after: Sequence[int] = ()
    ) -> Callable[[Sequence[Any], dict[str, Any]], protocol.NewJob]:
        """`new_job()` for many calls of one task: what the task fixes (its queue,
        options, meta, dependencies) is read and checked once, not once per call."""
        concurrency_key = getattr(task, "concurrency_key", None)
        computed = callable(concurrency_key)
        if not computed and (problem := concurrency_key_problem(concurrency_key)):
            raise InvalidTask(problem)  # A call's own key (enqueue_many's options).
        depends_on = (*self._dependency_job_ids(task), *after)
        unique = getattr(task, "unique", None)
        if unique is not None and depends_on:
            raise InvalidTask(UNIQUE_WITH_DEPENDENCIES.format(name=task.name))
        meta = getattr(task, "meta", None)
        fixed = {
            "task_path": task.module_path,
            "queue": task.queue_name,
            "backend": self.alias,
            "priority": task.priority,
            "max_attempts": getattr(task, "max_attempts", None) or conveyor_settings().MAX_ATTEMPTS,
            "run_after": task.run_after,
            "idempotency_key": getattr(task, "idempotency_key", None),
            "depends_on": depends_on,
            "dependency_policy": getattr(task, "dependency_policy", "cancel"),
            "tags": getattr(task, "tags", None) or None,
            "meta": _traced(json_round_trip(meta, "meta") if meta else None),
        }
        name, what_args, what_kwargs = task.name, f"{task.name}() args", f"{task.name}() kwargs"

        def make(args: Sequence[Any], kwargs: dict[str, Any]) -> protocol.NewJob:
            key = (
                computed_concurrency_key(name, concurrency_key, args, kwargs)
                if computed
                else concurrency_key
            )
            args = json_round_trip(list(args), what_args)
            kwargs = json_round_trip(dict(kwargs), what_kwargs)
            call_unique = None
            if unique is not None:
                call_unique = unique_call(
                    unique,
                    task_name=name,
                    task_path=task.module_path,
                    args=args,
                    kwargs=kwargs,
                    queue=task.queue_name,
                )
            return protocol.NewJob(
                args=args, kwargs=kwargs, unique=call_unique, concurrency_key=key, **fixed
            )

        return make

    def _dependency_job_ids(self, task: Any) -> list[int]:
        """The job ids of `task.depends_on`, which must share the new job's database."""
        database = conveyor_settings().database_for(task.queue_name)
        ids = []
        for dependency in getattr(task, "depends_on", ()):
            alias, job_id = parse_result_id(dependency)
            if alias != database:
                raise DependencyInOtherDatabase(
                    f"Dependency {dependency!r} lives in database {alias!r}, but a "
                    f"{task.name} job on queue {task.queue_name!r} lives in {database!r}; "
                    "a job and its dependencies share one database."
                )
            ids.append(job_id)
        return ids

    def enqueue(self, task: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> ConveyorTaskResult:
        self.validate_task(task)
        return self.enqueue_jobs([task], [self.new_job(task, args, kwargs)])[0]

    def enqueue_many(self, task: Any, calls: Iterable[Sequence[Any]]) -> list[ConveyorTaskResult]:
        """Enqueue many calls of one task in one transaction (and, for calls whose
        keys name existing jobs, a statement or two more), in order.

        Each call is `(args, kwargs)` or `(args, kwargs, options)`, where the
        options, for that call only, are `idempotency_key`, `unique` and
        `concurrency_key`. A call that fails its checks raises, and nothing of
        the batch stays (the caller's transaction stays usable).
        """
        self.validate_task(task)
        if getattr(task, "idempotency_key", None):
            raise InvalidTask(
                "enqueue_many() cannot share one idempotency_key across calls; give each "
                'call its own, as its third element: (args, kwargs, {"idempotency_key": ...}).'
            )
        calls = list(calls)
        with collector_paused():
            if len(calls) > protocol.ENQUEUE_PIECE and _calls_without_options(task, calls):
                written = self._write_in_pieces(task, calls)
            else:
                written = self._write_calls(task, calls)
        return self.announce(written)

    def _write_calls(self, task: Any, calls: list[Any]) -> list[tuple[ConveyorTaskResult, bool]]:
        """Every call checked, then all of them in one ENQUEUE (`write_jobs`)."""
        make = self.job_maker(task)
        tasks, jobs = [], []
        for number, call in enumerate(calls):
            args, kwargs, called = self._call(task, number, call)
            tasks.append(called)
            jobs.append(
                make(args, kwargs) if called is task else self.new_job(called, args, kwargs)
            )
        if not jobs:
            return []
        if any(job.idempotency_key for job in jobs) and len(jobs) > 1:
            # IdempotencyKeyReused may be raised after some of the calls were
            # inserted: none of the batch stays.
            with transaction.atomic(using=conveyor_settings().database_for(task.queue_name)):
                return self.write_jobs(tasks, jobs)
        return self.write_jobs(tasks, jobs)

    def _write_in_pieces(
        self, task: Any, calls: list[Any]
    ) -> list[tuple[ConveyorTaskResult, bool]]:
        """Calls without options of a task without dependencies, checked and sent piece
        by piece in one pipeline, in a transaction (a savepoint inside the
        caller's): PostgreSQL writes one piece while the next is built. Plain
        calls go through `protocol.enqueue_pieces`; calls of a unique task that
        skips its duplicates through `protocol.enqueue_unique_pieces`, which
        folds them as they come."""
        database = conveyor_settings().database_for(task.queue_name)
        connection = _enqueue_connection(database)
        make = self.job_maker(task)
        jobs: list[protocol.NewJob] = []

        def pieces() -> Iterator[list[protocol.NewJob]]:
            for start in range(0, len(calls), protocol.ENQUEUE_PIECE):
                piece = []
                for number in range(start, min(start + protocol.ENQUEUE_PIECE, len(calls))):
                    args, kwargs, _ = self._call(task, number, calls[number])
                    piece.append(make(args, kwargs))
                jobs.extend(piece)
                yield piece

        unique = getattr(task, "unique", None) is not None
        send = protocol.enqueue_unique_pieces if unique else protocol.enqueue_pieces
        with transaction.atomic(using=database), connection.wrap_database_errors:
            connection.ensure_connection()
            enqueued = send(
                connection.connection,
                lambda: enqueue_cursor(connection),
                pieces(),
                notify=conveyor_settings().NOTIFY,
            )
        return self._results([task] * len(jobs), database, jobs, enqueued)

    def _call(self, task: Any, number: int, call: Any) -> tuple[Any, Any, Any]:
        """One call of enqueue_many(): its arguments, and the task with its options."""
        if not isinstance(call, list | tuple) or len(call) not in (2, 3):
            raise InvalidTask(
                f"enqueue_many() call {number}: each call is (args, kwargs) or (args, kwargs, "
                f"options), not {type(call).__name__} {call!r:.80}."
            )
        args, kwargs, *rest = call
        if not rest or rest[0] is None:
            return args, kwargs, task
        options = rest[0]
        if not isinstance(options, Mapping):
            raise InvalidTask(
                f"enqueue_many() call {number}: its options must be a dict, not "
                f"{type(options).__name__} {options!r:.80}."
            )
        unknown = sorted(set(options) - set(PER_CALL_OPTIONS), key=str)
        if unknown:
            raise InvalidTask(
                f"enqueue_many() call {number}: unknown option(s) "
                f"{', '.join(map(repr, unknown))}; a call takes {', '.join(PER_CALL_OPTIONS)}."
            )
        try:
            return args, kwargs, task.using(**options)
        except InvalidTask as exc:
            raise InvalidTask(f"enqueue_many() call {number}: {exc}") from exc

    def enqueue_jobs(
        self, tasks: Sequence[Any], jobs: list[protocol.NewJob]
    ) -> list[ConveyorTaskResult]:
        """Insert jobs (all in the database of the first task's queue) in one ENQUEUE.

        On the caller's connection, so they commit with its transaction; each
        result is sent with `task_enqueued` (or `task_enqueue_replayed` when an
        idempotency key named an existing job).
        """
        return self.announce(self.write_jobs(tasks, jobs))

    def write_jobs(
        self, tasks: Sequence[Any], jobs: list[protocol.NewJob]
    ) -> list[tuple[ConveyorTaskResult, bool]]:
        """`enqueue_jobs()` without its signals: each call's result, and whether
        it was created (False: a key named an existing job)."""
        database = conveyor_settings().database_for(tasks[0].queue_name)
        connection = _enqueue_connection(database)
        with enqueue_cursor(connection) as cursor:
            enqueued = protocol.enqueue(cursor, jobs, notify=conveyor_settings().NOTIFY)
        return self._results(tasks, database, jobs, enqueued)

    def _results(
        self,
        tasks: Sequence[Any],
        database: str,
        jobs: list[protocol.NewJob],
        enqueued: list[protocol.Enqueued],
    ) -> list[tuple[ConveyorTaskResult, bool]]:
        """Each call's result from what ENQUEUE answered, and whether it was created."""
        written = []
        for task, job, row in zip(tasks, jobs, enqueued, strict=True):
            if not row.created:  # A key (idempotency or unique) named an existing job.
                replayed = self._existing(database, row)
                if job.unique is not None:
                    logger.debug(
                        "%s call folded into job %s (%s, unique key %s)%s",
                        task.name, replayed.id, row.state, job.unique.key,
                        ", its arguments replaced" if row.replaced else "",
                    )  # fmt: skip
                written.append((replayed, False))
                continue
            written.append((self._created(task, database, job, row), True))
        return written

    def _created(
        self, task: Any, database: str, job: protocol.NewJob, row: protocol.Enqueued
    ) -> ConveyorTaskResult:
        """The result of a job this call inserted, from what it sent and ENQUEUE returned."""
        return task_result(
            task,
            database=database,
            job_id=row.id,
            state=row.state,
            args=job.args,
            kwargs=job.kwargs,
            backend=self.alias,
            enqueued_at=row.enqueued_at,
            tags=job.tags,
            meta=job.meta,
        )

    def announce(self, written: list[tuple[ConveyorTaskResult, bool]]) -> list[ConveyorTaskResult]:
        """Send `task_enqueued` for each created result (`task_enqueue_replayed`
        for one a key named), in call order; the results."""
        send = heard(task_enqueued, log_task_enqueued, logging.DEBUG)
        for result, created in written:
            if not created:
                task_enqueue_replayed.send(type(self), task_result=result)
            elif send:
                task_enqueued.send(type(self), task_result=result)
        return [result for result, _ in written]

    def get_result(self, result_id: str) -> ConveyorTaskResult:
        database, job_id = parse_result_id(result_id)
        if database not in conveyor_settings().databases():
            raise TaskResultDoesNotExist(f"No job has the id {result_id!r}.")
        return self._load(database, job_id)

    def _existing(self, database: str, row: protocol.Enqueued) -> ConveyorTaskResult:
        """The result of the job a call's key named, from the row ENQUEUE read (no query)."""
        assert row.row is not None  # protocol.enqueue gives every call it did not create one.
        # The columns result_from_job reads, without a model instance: a batch may fold
        # thousands of calls.
        job = SimpleNamespace(**row.row)
        return replace(
            result_from_job(job, database=database, created=False),  # type: ignore[arg-type]
            replaced=row.replaced,
        )

    def _load(self, database: str, job_id: int, *, created: bool = True) -> ConveyorTaskResult:
        from .models import Job

        try:
            job = Job.objects.using(database).get(pk=job_id)
        except Job.DoesNotExist as exc:
            raise TaskResultDoesNotExist(
                f"No job has the id {result_id(database, job_id)!r}."
            ) from exc
        return result_from_job(job, database=database, created=created)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        if not apps.is_installed("django_conveyor"):
            yield checks.Error(
                f"Task backend {self.alias!r} uses ConveyorBackend, but django_conveyor "
                "is not in INSTALLED_APPS.",
                hint='Add "django_conveyor" to INSTALLED_APPS and run migrate.',
                id="conveyor.E010",
            )


def _enqueue_connection(database: str) -> Any:
    """Django's connection to `database`, which must be PostgreSQL (E020, for a
    process that skipped the checks)."""
    connection = connections[database]
    if connection.vendor != "postgresql":
        engine = connection.settings_dict.get("ENGINE", "")
        raise ConveyorConfigurationError(
            f"{not_postgresql(database, engine)} Point it at PostgreSQL 14 or newer."
        )
    return connection


def _calls_without_options(task: Any, calls: list[Any]) -> bool:
    """Calls of `task` that may go in pieces: the task has no dependencies and
    its unique key (if any) skips duplicates, and no call brings options, so
    each call's job is a plain one (`protocol.is_plain`) or one only its unique
    key can refuse (`protocol.is_skipping`). A call of another shape is not:
    the one-statement path names what is wrong with it."""
    unique = getattr(task, "unique", None)
    if (unique is not None and unique.replaces) or getattr(task, "depends_on", ()):
        return False
    return all(
        isinstance(call, list | tuple) and (len(call) == 2 or (len(call) == 3 and call[2] is None))
        for call in calls
    )


def enqueue_cursor(connection: Any) -> Any:
    """Django's cursor for ENQUEUE; one that binds parameters on the server when the
    connection may keep prepared statements, so that PostgreSQL plans ENQUEUE once
    per connection instead of once per call (about half its time for one job).

    Django turns prepared statements off unless OPTIONS sets `prepare_threshold`
    (poolers in transaction mode lose them), and its default client-side binding
    cannot prepare at all: with a threshold set and client-side binding, this
    cursor binds on the server, and psycopg prepares ENQUEUE after that many
    calls. Otherwise, and for everything else, it is Django's own cursor (its
    health check, time zone, execute wrappers and query log either way).
    """
    connection.ensure_connection()
    raw = connection.connection
    factory = getattr(raw, "cursor_factory", None)
    if (
        getattr(raw, "prepare_threshold", None) is None
        or factory is None
        or not issubclass(factory, psycopg.ClientCursor)
    ):
        return connection.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor

    raw.cursor_factory = ServerBindingCursor
    try:
        return connection.cursor()
    finally:
        raw.cursor_factory = factory


def concurrency_key_problem(key: Any) -> str | None:
    """What is wrong with a concurrency key (None or text up to 255 characters), if anything."""
    if key is None:
        return None
    if not isinstance(key, str) or not key or len(key) > MAX_CONCURRENCY_KEY_LENGTH:
        return (
            f"concurrency_key must be a non-empty string of at most "
            f"{MAX_CONCURRENCY_KEY_LENGTH} characters (or a function of the call's "
            f"arguments that returns one, or None), not {key!r:.80}."
        )
    if problem := text_problem(key):
        return f"concurrency_key {key!r:.80} {problem}."
    return None


def computed_concurrency_key(
    name: str, function: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> str | None:
    """@task(concurrency_key=f): f(*args, **kwargs), checked; its error names the task."""
    try:
        key = function(*args, **kwargs)
    except Exception as exc:
        raise InvalidTask(
            f"{name}'s concurrency_key function raised {type(exc).__name__}: {exc}"
        ) from exc
    if problem := concurrency_key_problem(key):
        raise InvalidTask(f"{name}'s concurrency_key function returned a bad key: {problem}")
    return key
