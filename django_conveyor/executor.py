"""Running one attempt: resolve, call, classify, report.

Each step is a short function; the worker writes the resulting `Outcome`
through the protocol, guarded by the attempt's token.
"""

from __future__ import annotations

import functools
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any

from django.db import connections
from django.utils.module_loading import import_string

from .backoff import retry_delay
from .compat import Task, TaskError, TaskResultStatus, task_finished, task_started
from .context import JobContext, LeaseState
from .exceptions import ArgumentsNotSerializable, Discard, LeaseLost, Snooze
from .logs import log_job
from .protocol import Lease
from .results import ConveyorTaskResult, result_id
from .serialization import json_round_trip

logger = logging.getLogger("django_conveyor.executor")

COMPLETE = "complete"
RETRY = "retry"
FAIL = "fail"
SNOOZE = "snooze"
DONE_IN_ATOMIC = "done_in_atomic"  # context.atomic() already wrote the outcome.
LOST = "lost"  # The handler met LeaseLost: nothing to write.


@dataclass(slots=True)
class Outcome:
    kind: str
    lease: Lease
    state: LeaseState
    return_value: Any = None
    delay: float = 0.0
    error: dict[str, Any] = field(default_factory=dict)


def error_entry(exc: BaseException) -> dict[str, Any]:
    cls = type(exc)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


@functools.lru_cache(maxsize=1024)
def import_task(task_path: str) -> Task:
    obj = import_string(task_path)
    if not isinstance(obj, Task):
        raise TypeError(f"{task_path!r} is not a task (decorate it with @task).")
    return obj


def resolve(lease: Lease) -> Task:
    return import_task(lease.task_path)


def task_or_none(task_path: str) -> Task | None:
    """The task, or None when it cannot be imported (execute reports that)."""
    try:
        return import_task(task_path)
    except Exception:
        return None


def task_timeout(task_path: str) -> float | None:
    return getattr(task_or_none(task_path), "timeout", None)


def build_result(task: Task, lease: Lease, state: LeaseState) -> ConveyorTaskResult:
    return ConveyorTaskResult(
        task=task,
        id=result_id(state.database, lease.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=lease.enqueued_at,
        started_at=lease.started_at,
        finished_at=None,
        last_attempted_at=lease.started_at,
        args=lease.args,
        kwargs=lease.kwargs,
        backend=lease.backend,
        errors=[],
        worker_ids=[state.owner] * lease.attempt,
        state="running",
    )


def call(task: Task, lease: Lease, result: ConveyorTaskResult, state: LeaseState) -> Any:
    if not task.takes_context:
        return task.call(*lease.args, **lease.kwargs)
    context = JobContext(
        task_result=result,
        job_id=lease.id,
        token=lease.version,
        worker_id=state.owner,
        database=state.database,
        lease_state=state,
    )
    return task.call(context, *lease.args, **lease.kwargs)


def classify(exc: BaseException, task: Task | None, lease: Lease, state: LeaseState) -> Outcome:
    if isinstance(exc, LeaseLost):
        return Outcome(LOST, lease, state, error=error_entry(exc))
    if isinstance(exc, Snooze):
        return Outcome(SNOOZE, lease, state, delay=exc.seconds)
    if isinstance(exc, Discard | ArgumentsNotSerializable):
        return Outcome(FAIL, lease, state, error=error_entry(exc))
    delay = retry_delay(task, lease.attempt)
    return Outcome(RETRY, lease, state, delay=delay, error=error_entry(exc))


def report(task: Task | None, result: ConveyorTaskResult | None, outcome: Outcome) -> None:
    if task is None or result is None:
        return
    if outcome.kind in (COMPLETE, DONE_IN_ATOMIC):
        object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "_return_value", outcome.return_value)
    elif outcome.kind in (FAIL, RETRY, LOST):
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(
            result,
            "errors",
            [TaskError(**{k: outcome.error[k] for k in ("exception_class_path", "traceback")})],
        )
    else:
        return
    task_finished.send(type(task.get_backend()), task_result=result)


def connection_hygiene() -> None:
    """Drop broken or obsolete handler connections, but keep healthy ones.

    Django closes a CONN_MAX_AGE=0 connection after every request; a worker
    slot would then reconnect for every job, so here such a connection lives
    as long as the slot and is closed only when it is unusable.
    """
    for conn in connections.all(initialized_only=True):
        if conn.settings_dict.get("CONN_MAX_AGE") == 0:
            conn.close_at = None
        conn.close_if_unusable_or_obsolete()


def execute(lease: Lease, state: LeaseState) -> Outcome:
    """Run one attempt and say what should be written; never raises."""
    task: Task | None = None
    result: ConveyorTaskResult | None = None
    try:
        task = resolve(lease)
        result = build_result(task, lease, state)
        task_started.send(type(task.get_backend()), task_result=result)
        value = call(task, lease, result, state)
        value = json_round_trip(value, f"{task.name}() return value")
        kind = DONE_IN_ATOMIC if state.completed_in_atomic else COMPLETE
        outcome = Outcome(kind, lease, state, return_value=value)
    except BaseException as exc:
        if state.completed_in_atomic:
            log_job(logger, logging.ERROR, lease, "raised after its guarded commit", exc_info=exc)
            outcome = Outcome(DONE_IN_ATOMIC, lease, state)
        else:
            outcome = classify(exc, task, lease, state)
            level = logging.INFO if outcome.kind == SNOOZE else logging.WARNING
            log_job(logger, level, lease, "raised %s", type(exc).__name__)
    finally:
        connection_hygiene()
    report(task, result, outcome)
    return outcome
