"""Running one attempt: resolve, call, classify, report.

Each step is a short function; `execute` returns the attempt's `Outcome`,
which the control loop writes through the protocol, guarded by the token.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync
from django.db import connections

from ...compat import Task, log_task_started, task_started
from ...context import JobContext
from ...exceptions import ArgumentsNotSerializable, Discard, LeaseLost, Snooze
from ...observability import joblogs, tracing
from ...results import ConveyorTaskResult, enqueued_task, task_result
from ...serialization import json_round_trip
from ...signals import heard
from ...states import JobState
from ...tasks import resolve_task
from .. import attempts
from ..attempts import Attempt, Outcome, error_entry
from ..backoff import retry_delay
from ..connections import is_read_only
from ..instrument import log_job

logger = logging.getLogger(__name__)

_PLAIN_CALL = Task.call


def running_result(task: Task, attempt: Attempt) -> ConveyorTaskResult:
    lease = attempt.lease
    return task_result(
        enqueued_task(
            task,
            priority=lease.priority,
            queue=lease.queue,
            run_after=lease.enqueued_run_after,
            backend=lease.backend,
        ),
        database=attempt.database,
        job_id=lease.id,
        state=JobState.RUNNING,
        args=lease.args,
        kwargs=lease.kwargs,
        backend=lease.backend,
        enqueued_at=lease.enqueued_at,
        started_at=lease.started_at,
        errors=lease.errors or (),
        lease_owner=lease.owner,
        tags=lease.tags,
        meta=lease.meta,
    )


# Once per function, not per attempt: inspect's test unwraps partials and methods.
_is_coroutine = functools.lru_cache(maxsize=1024)(iscoroutinefunction)


def call(task: Task, attempt: Attempt, result: ConveyorTaskResult | None) -> Any:
    lease = attempt.lease
    args = (
        [JobContext(task_result=result, held=attempt), *lease.args]
        if task.takes_context
        else lease.args
    )
    func = task.func
    if _is_coroutine(func):
        return async_to_sync(cancellable(func, attempt))(*args, **lease.kwargs)
    if type(task).call is _PLAIN_CALL:  # What Task.call does with a plain function.
        return func(*args, **lease.kwargs)
    return task.call(*args, **lease.kwargs)


def traced_call(task: Task, attempt: Attempt, result: ConveyorTaskResult | None) -> Any:
    """`call` inside the attempt's span ([otel]); what the handler raised marks it failed."""
    with tracing.attempt_span(attempt.lease) as span:
        try:
            return call(task, attempt, result)
        except BaseException as exc:
            if not isinstance(exc, Snooze):
                tracing.failed(span, exc)
            raise


def cancellable(func: Callable[..., Any], attempt: Attempt) -> Callable[..., Any]:
    """Run an async handler as a task that losing the lease (or a cancel) cancels."""

    async def run(*args: Any, **kwargs: Any) -> Any:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        assert task is not None
        attempt.cancel_async = lambda: loop.call_soon_threadsafe(task.cancel)
        try:
            if attempt.lost:
                raise asyncio.CancelledError  # Lost before it started.
            return await func(*args, **kwargs)
        finally:
            attempt.cancel_async = None

    return run


def classify(exc: BaseException, task: Task | None, attempt: Attempt) -> Outcome:
    if isinstance(exc, LeaseLost):
        return Outcome(attempts.LOST, attempt, error=error_entry(exc))
    if isinstance(exc, Snooze):
        if not 0 <= exc.seconds < math.inf:  # NaN too: retrying the same code cannot help.
            note = (
                f"The job failed: Snooze({exc.seconds!r}) asks for no delay PostgreSQL can "
                "store; a snooze needs a finite number of seconds, zero or more."
            )
            return Outcome(attempts.FAIL, attempt, error=error_entry(exc, note))
        return attempts.snooze(attempt, exc.seconds)
    if isinstance(exc, Discard | ArgumentsNotSerializable):
        return Outcome(attempts.FAIL, attempt, error=error_entry(exc))
    return attempts.retry(attempt, retry_delay(task, attempt.lease.attempt), error_entry(exc))


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


def execute(attempt: Attempt) -> Outcome:
    """Run one attempt and say what should be written; never raises.

    Sends `task_started`; `task_finished` waits until the outcome is
    written (reporting.py), since the fence may refuse it. The attempt's
    TaskResult is built only when something uses it: a handler that takes a
    context, or a receiver of `task_started` other than django.tasks' own
    log lines while their level is off.
    """
    lease = attempt.lease
    task: Task | None = None
    result: ConveyorTaskResult | None = None
    try:
        task = resolve_task(lease.task_path)
        attempt.timeout = getattr(task, "timeout", None)  # From now on timeouts.py watches it.
        if heard(task_started, log_task_started, logging.INFO):
            attempt.result = result = running_result(task, attempt)
            task_started.send(type(task.get_backend()), task_result=result)
        elif task.takes_context:
            attempt.result = result = running_result(task, attempt)
        run = traced_call if tracing.enabled() else call
        with joblogs.attempt_log(attempt):
            value = run(task, attempt, result)
        value = json_round_trip(value, f"{task.name}() return value")
        kind = attempts.DONE_IN_ATOMIC if attempt.completed_in_atomic else attempts.COMPLETE
        outcome = Outcome(kind, attempt, return_value=value)
    except BaseException as exc:
        if attempt.completed_in_atomic:
            log_job(logger, logging.ERROR, lease, "raised after its guarded commit", exc_info=exc)
            outcome = Outcome(attempts.DONE_IN_ATOMIC, attempt)
        else:
            if is_read_only(exc):
                # This slot's connection reached a server that takes no writes:
                # drop it, or every later attempt here would fail the same way.
                connections.close_all()
            outcome = classify(exc, task, attempt)
            outcome.exception = exc  # For task_finished receivers' sys.exc_info().
            # What became of it is logged once it is written (attempts.log_written).
            log_job(logger, logging.DEBUG, lease, "raised %s", type(exc).__name__)
    return outcome
