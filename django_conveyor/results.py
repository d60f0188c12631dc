"""Turning `conveyor_job` rows into `django.tasks` results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from .compat import TASK_REFRESH_ATTRS, Task, TaskError, TaskResult, TaskResultDoesNotExist
from .conf import conveyor_settings
from .states import TASK_STATUS, JobState

if TYPE_CHECKING:
    from .models import Job


@dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorTaskResult(TaskResult):
    created: bool = True  # False when an idempotency key returned an existing job.
    state: str = JobState.AVAILABLE  # The job's own state, finer than `status`.

    def refresh(self) -> None:
        """Reload from the database, including the finer `state`."""
        self._copy_from(self.task.get_backend().get_result(self.id))

    async def arefresh(self) -> None:
        self._copy_from(await self.task.get_backend().aget_result(self.id))

    def _copy_from(self, fresh: TaskResult) -> None:
        for attr in (*TASK_REFRESH_ATTRS, "state"):
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


def worker_ids(errors: list[dict[str, Any]], state: str, lease_owner: str | None) -> list[str]:
    """One worker id per attempt that ran, as django.tasks counts attempts.

    Every failed or lost attempt left an error entry naming its worker; the
    attempt that is running or that completed is the current lease owner.
    """
    ids = [e["worker"] for e in errors if e.get("worker")]
    if state in (JobState.RUNNING, JobState.COMPLETED) and lease_owner:
        ids.append(lease_owner)
    return ids


def resolve_task(task_path: str) -> Task:
    try:
        obj = import_string(task_path)
    except ImportError as exc:
        raise TaskResultDoesNotExist(
            f"The job's task {task_path!r} cannot be imported: {exc}."
        ) from exc
    if not isinstance(obj, Task):
        raise TaskResultDoesNotExist(f"{task_path!r} is not a task (decorate it with @task).")
    return obj


def result_from_job(
    job: Job, task: Task | None = None, *, created: bool = True, database: str | None = None
) -> ConveyorTaskResult:
    task = task or resolve_task(job.task_path)
    result = ConveyorTaskResult(
        task=task,
        id=result_id(database or job._state.db or conveyor_settings().DATABASE, job.id),
        status=TASK_STATUS[JobState(job.state)],
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=job.args,
        kwargs=job.kwargs,
        backend=job.backend,
        errors=[
            TaskError(
                exception_class_path=e.get("exception_class_path", "builtins.Exception"),
                traceback=e.get("traceback", ""),
            )
            for e in job.errors
        ],
        worker_ids=worker_ids(job.errors, job.state, job.lease_owner),
        created=created,
        state=job.state,
    )
    if job.state == JobState.COMPLETED:
        object.__setattr__(result, "_return_value", job.return_value)
    return result
