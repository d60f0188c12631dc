"""`ConveyorBackend`: the django.tasks backend over `conveyor_job`.

Enqueue runs on the caller's database connection, so it commits or rolls
back with the caller's transaction; its NOTIFY is delivered only on commit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import connections
from django.utils import timezone

from . import protocol
from .bounds import MAX_INT, MAX_SECONDS, count_breach, is_count, is_number, seconds_breach
from .compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    TaskResultDoesNotExist,
    log_task_enqueued,
    task_enqueued,
)
from .conf import conveyor_settings
from .exceptions import DependencyInOtherDatabase
from .results import ConveyorTaskResult, parse_result_id, result_from_job, result_id, task_result
from .serialization import json_round_trip, text_problem
from .signals import heard, task_enqueue_replayed
from .tasks import DEPENDENCY_POLICIES, ConveyorTask

MAX_IDEMPOTENCY_KEY_LENGTH = 255


def _check_run_after(run_after: Any) -> None:
    """A datetime no later than ten years from now (bounds.MAX_SECONDS), or None."""
    if run_after is None:
        return
    if not isinstance(run_after, datetime):
        hint = (
            " Parse it first, for example with datetime.fromisoformat()."
            if isinstance(run_after, str)
            else " Add a timedelta to timezone.now() instead."
            if isinstance(run_after, timedelta | int | float)
            else ""
        )
        raise InvalidTask(
            f"run_after must be a datetime, not {type(run_after).__name__} {run_after!r:.80}.{hint}"
        )
    # A naive one is local time (django.tasks refuses it when USE_TZ).
    now = datetime.now() if timezone.is_naive(run_after) else timezone.now()
    latest = now + timedelta(seconds=MAX_SECONDS)
    if run_after > latest:
        raise InvalidTask(
            f"run_after must be at most {MAX_SECONDS:.0f} seconds (ten years) from now, "
            f"not {run_after.isoformat()}."
        )


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
        _check_run_after(task.run_after)
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

    def new_job(
        self, task: Any, args: Sequence[Any], kwargs: dict[str, Any], after: Sequence[int] = ()
    ) -> protocol.NewJob:
        """The row one call writes, its arguments checked; `after` adds job ids to wait for.

        The shared enqueue path is `new_job()` then `enqueue_jobs()`: `enqueue()`
        takes it, and so does a workflow (workflows.py), which adds its edges
        between the two. Call `validate_task()` first.
        """
        return protocol.NewJob(
            task_path=task.module_path,
            args=json_round_trip(list(args), f"{task.name}() args"),
            kwargs=json_round_trip(dict(kwargs), f"{task.name}() kwargs"),
            queue=task.queue_name,
            backend=self.alias,
            priority=task.priority,
            max_attempts=getattr(task, "max_attempts", None) or conveyor_settings().MAX_ATTEMPTS,
            run_after=task.run_after,
            idempotency_key=getattr(task, "idempotency_key", None),
            depends_on=(*self._dependency_job_ids(task), *after),
            dependency_policy=getattr(task, "dependency_policy", "cancel"),
        )

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

    def enqueue_many(
        self, task: Any, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[ConveyorTaskResult]:
        """Enqueue many calls of one task with a single INSERT."""
        self.validate_task(task)
        if getattr(task, "idempotency_key", None):
            raise InvalidTask(
                "enqueue_many() cannot share one idempotency_key across calls; "
                "enqueue keyed jobs one at a time."
            )
        jobs = [self.new_job(task, args, kwargs) for args, kwargs in calls]
        return self.enqueue_jobs([task] * len(jobs), jobs) if jobs else []

    def enqueue_jobs(
        self, tasks: Sequence[Any], jobs: list[protocol.NewJob]
    ) -> list[ConveyorTaskResult]:
        """Insert jobs (all in the database of the first task's queue) in one ENQUEUE.

        On the caller's connection, so they commit with its transaction; each
        result is sent with `task_enqueued` (or `task_enqueue_replayed` when an
        idempotency key named an existing job).
        """
        database = conveyor_settings().database_for(tasks[0].queue_name)
        with connections[database].cursor() as cursor:
            enqueued = protocol.enqueue(cursor, jobs, notify=conveyor_settings().NOTIFY)
        results = []
        send = heard(task_enqueued, log_task_enqueued, logging.DEBUG)
        for task, job, row in zip(tasks, jobs, enqueued, strict=True):
            if not row.created:  # The idempotency key named an existing job.
                replayed = self._load(database, row.id, created=False)
                task_enqueue_replayed.send(type(self), task_result=replayed)
                results.append(replayed)
                continue
            result = task_result(
                task,
                database=database,
                job_id=row.id,
                state=row.state,
                args=job.args,
                kwargs=job.kwargs,
                backend=self.alias,
                enqueued_at=row.enqueued_at,
            )
            if send:
                task_enqueued.send(type(self), task_result=result)
            results.append(result)
        return results

    def get_result(self, result_id: str) -> ConveyorTaskResult:
        database, job_id = parse_result_id(result_id)
        if database not in conveyor_settings().databases():
            raise TaskResultDoesNotExist(f"No job has the id {result_id!r}.")
        return self._load(database, job_id)

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
