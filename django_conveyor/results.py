"""The one constructor of `ConveyorTaskResult`, and result ids.

Enqueue, the worker and `get_result()` all build results through
`task_result()`, so a result means the same wherever it comes from: one
worker id per attempt that ran, one `TaskError` per failed attempt, the
job's own `state` next to the django.tasks `status`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .compat import (
    TASK_REFRESH_ATTRS,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from .conf import conveyor_settings
from .exceptions import UnknownTask
from .observability.progress import Progress
from .states import TASK_STATUS, JobState
from .tasks import resolve_task

if TYPE_CHECKING:
    from .models import Job


@dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorTaskResult(TaskResult):
    created: bool = True  # False when an idempotency or unique key returned an existing job.
    replaced: bool = False  # That job took this call's arguments (on_duplicate="replace").
    state: str = JobState.AVAILABLE  # The job's own state, finer than `status`.
    # Observability (docs/observability.md): the job's labels, and the
    # progress its running handler last reported (None until one did).
    tags: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    progress: Progress | None = None

    def __post_init__(self) -> None:
        # No normalising copy of args and kwargs: every result is built by
        # task_result() from JSON values (a jsonb column, or enqueue's JSON
        # round trip), and the worker builds two per attempt.
        pass

    def refresh(self) -> None:
        """Reload from the database, including the finer `state`."""
        self._copy_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._copy_from(await self.task.get_backend().aget_result(self.id))

    def _copy_from(self, fresh: TaskResult) -> None:
        # refresh() updates this very object (the django.tasks contract), frozen or not.
        for attr in (*TASK_REFRESH_ATTRS, "state", "tags", "meta", "progress"):
            object.__setattr__(self, attr, getattr(fresh, attr))


def result_id(database: str, job_id: int) -> str:
    """The public id: the bare job id in the main database, `alias:id` in a shard."""
    return str(job_id) if database == conveyor_settings().DATABASE else f"{database}:{job_id}"


def parse_result_id(value: str) -> tuple[str, int]:
    alias, _, number = str(value).rpartition(":")
    try:
        return alias or conveyor_settings().DATABASE, int(number)
    except ValueError:
        raise TaskResultDoesNotExist(f"No job has the id {value!r}.") from None


def worker_ids(
    errors: Sequence[Mapping[str, Any]], state: str, lease_owner: str | None
) -> list[str]:
    """One worker id per attempt that ran, as django.tasks counts attempts.

    Every failed or lost attempt left an error entry naming its worker; the
    attempt that is running or that completed is the current lease owner.
    """
    ids = [e["worker"] for e in errors if e.get("worker")]
    if state in (JobState.RUNNING, JobState.COMPLETED) and lease_owner:
        ids.append(lease_owner)
    return ids


def task_error(entry: Mapping[str, Any]) -> TaskError:
    """A django.tasks TaskError from one entry of a job's `errors`."""
    return TaskError(
        exception_class_path=entry.get("exception_class_path", "builtins.Exception"),
        traceback=entry.get("traceback", ""),
    )


def enqueued_task(
    task: Task, *, priority: int, queue: str, run_after: datetime | None, backend: str
) -> Task:
    """`task` as this job was enqueued: its priority, queue, run_after and backend.

    As django.tasks' database backends do, from the row; the decorated task
    itself when nothing differs (the common case, and no copy to make).
    """
    changes: dict[str, Any] = {}
    if priority != task.priority:
        changes["priority"] = priority
    if queue != task.queue_name:
        changes["queue_name"] = queue
    if run_after is not None and run_after != task.run_after:
        changes["run_after"] = run_after
    if backend != task.backend:
        changes["backend"] = backend
    return Task.using(task, **changes) if changes else task


def task_result(
    task: Task,
    *,
    database: str,
    job_id: int,
    state: str,
    args: list[Any],
    kwargs: dict[str, Any],
    backend: str,
    enqueued_at: datetime | None,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
    errors: Sequence[Mapping[str, Any]] = (),
    lease_owner: str | None = None,
    return_value: Any = None,
    created: bool = True,
    tags: Sequence[str] | None = None,
    meta: dict[str, Any] | None = None,
    progress: Any = None,
) -> ConveyorTaskResult:
    """The result of a job in `state`, from its row's values (`progress`: the column's JSON)."""
    result = ConveyorTaskResult(
        task=task,
        id=result_id(database, job_id),
        status=TASK_STATUS[JobState(state)],
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=started_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=[task_error(e) for e in errors] if errors else [],
        worker_ids=worker_ids(errors, state, lease_owner) if errors or lease_owner else [],
        created=created,
        state=state,
        tags=tuple(tags) if tags else (),
        meta=meta or {},
        progress=Progress.of(progress) if progress is not None else None,
    )
    return _with_return_value(result, return_value)


def finished(
    result: ConveyorTaskResult,
    *,
    status: TaskResultStatus,
    return_value: Any = None,
    error: Mapping[str, Any] | None = None,
) -> ConveyorTaskResult:
    """`result` after its attempt ended: a new value with the attempt's status and error."""
    errors = [*result.errors, task_error(error)] if error else result.errors
    return _with_return_value(replace(result, status=status, errors=errors), return_value)


def _with_return_value(result: ConveyorTaskResult, value: Any) -> ConveyorTaskResult:
    # django.tasks declares _return_value with init=False: no constructor or
    # replace() can set it, so it is set here, once, on a result not yet shared.
    if result.status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)
    return result


def result_from_job(job: Job, *, database: str, created: bool = True) -> ConveyorTaskResult:
    """The result of a `conveyor_job` row read from `database`."""
    try:
        task = resolve_task(job.task_path)
    except UnknownTask as exc:
        raise TaskResultDoesNotExist(str(exc)) from exc
    task = enqueued_task(
        task,
        priority=job.priority,
        queue=job.queue,
        run_after=job.enqueued_run_after,
        backend=job.backend,
    )
    return task_result(
        task,
        database=database,
        job_id=job.id,
        state=job.state,
        args=job.args,
        kwargs=job.kwargs,
        backend=job.backend,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        errors=job.errors,
        lease_owner=job.lease_owner,
        return_value=job.return_value,
        created=created,
        tags=job.tags if isinstance(job.tags, list) else None,  # A bad row shows none.
        meta=job.meta if isinstance(job.meta, dict) else None,
        progress=job.progress,
    )
