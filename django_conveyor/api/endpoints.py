"""The endpoints: each validates, then hands over to the backend or `operations`.

Job writes go through the same paths as the rest of the package: enqueue
through the task's ConveyorBackend (so `protocol.enqueue`), requeue and
cancel through `operations` (so `protocol.requeue`, `protocol.cancel` and,
for a running job, `protocol.request_cancel`),
as the admin and the CLI do.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Header, Query, Router
from ninja.decorators import decorate_view
from ninja.responses import Status

from .. import limits, operations, queue_counts
from ..backend import run_after_problem
from ..bounds import MAX_INT, is_count
from ..compat import InvalidTask, Task, TaskResultDoesNotExist
from ..conf import conveyor_settings
from ..exceptions import ArgumentsNotSerializable, GateError, GateNotFound, IdempotencyKeyReused
from ..models import Job, JobLog
from ..observability import search
from ..observability.progress import Progress
from ..results import parse_result_id, result_id
from ..serialization import text_problem
from ..states import CANCELLABLE_STATES, REQUEUEABLE_STATES, JobState
from ..tasks import known_task_paths
from ..unique import Kept, Unique
from . import listing
from .allowlist import NotAllowed, UnknownTask, allow_list
from .auth import credentials
from .errors import Problem, field_problem, limit_body
from .schemas import (
    DEFAULT_PAGE_SIZE,
    MAX_PAGE_SIZE,
    AttemptLogOut,
    EnqueueIn,
    JobOut,
    JobPage,
    LimitsIn,
    LimitsOut,
    QueueOut,
    SignalIn,
    StateName,
    UniqueIn,
)
from .schemas import Problem as ProblemOut

MAX_IDEMPOTENCY_KEY_LENGTH = 255
NAMESPACE = "conveyor-api"

logger = logging.getLogger(__name__)
router = Router()
ERRORS = {code: ProblemOut for code in (400, 401, 403, 404)}


def _database(job_id: str) -> tuple[str, int]:
    try:
        database, number = parse_result_id(job_id)
    except TaskResultDoesNotExist:
        raise Problem(404, f"No job has the id {job_id!r}.") from None
    if database not in conveyor_settings().databases():
        raise Problem(404, f"No job has the id {job_id!r}.")
    return database, number


def _job(job_id: str) -> tuple[str, Job]:
    database, number = _database(job_id)
    job = Job.objects.using(database).filter(pk=number).first()
    if job is None:
        raise Problem(404, f"No job has the id {job_id!r}.")
    return database, job


def job_summary(job: Job, database: str) -> dict[str, Any]:
    return {
        "id": result_id(database, job.id),
        "task": job.task_path,
        "queue": job.queue,
        "state": job.state,
        "priority": job.priority,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "run_after": job.run_after,
        "enqueued_at": job.enqueued_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "tags": job.tags if isinstance(job.tags, list) else [],
    }


def job_out(job: Job, database: str) -> dict[str, Any]:
    return {
        **job_summary(job, database),
        "args": job.args,
        "kwargs": job.kwargs,
        "idempotency_key": job.idempotency_key,
        "return_value": job.return_value if job.state == JobState.COMPLETED else None,
        "errors": [_job_error(entry) for entry in job.errors or ()],
        "cancel_requested_at": job.cancel_requested_at,
        "cancel_requested_by": job.cancel_requested_by,
        "gate": job.gate,
        "gate_deadline": job.gate_deadline,
        "progress": _progress(job.progress),
        "meta": job.meta if isinstance(job.meta, dict) else {},
        "unique": unique_out(job),
    }


def unique_out(job: Job) -> dict[str, Any] | None:
    """A unique job's key and what it was made of (UniqueOut); None without a key."""
    if job.unique_key is None:
        return None
    kept = Kept.of(job.uniqueness)
    window = job.unique_window
    return {
        "key": job.unique_key,
        "window_start": window,
        "window_end": window + timedelta(seconds=kept.period) if window and kept.period else None,
        "period": kept.period,
        "by": kept.by,
        "value": kept.value,
        "states": Kept.states_of(job.unique_states),
        "on_duplicate": kept.on_duplicate,
        "replaced": kept.replaced,
        "replaced_at": kept.replaced_at,
    }


def _job_error(entry: Any) -> dict[str, Any]:
    """An error entry as JobError shows it, whatever a row written by hand holds."""
    entry = entry if isinstance(entry, dict) else {"traceback": str(entry)}
    attempt = entry.get("attempt")

    def text(name: str) -> str | None:
        value = entry.get(name)
        return value if isinstance(value, str) or value is None else str(value)

    return {
        "attempt": attempt if is_count(attempt) and abs(attempt) <= MAX_INT else None,
        "worker": text("worker"),
        "exception_class_path": text("exception_class_path") or "",
        "traceback": text("traceback") or "",
        "time": text("time"),
    }


def _progress(value: Any) -> dict[str, Any] | None:
    progress = Progress.of(value)
    return progress.as_json() if progress else None


def _location(job_id: str) -> str:
    return reverse(f"{NAMESPACE}:get_job", kwargs={"job_id": job_id})


def _resolve(name: str) -> Task:
    try:
        return allow_list().resolve(name)
    except NotAllowed:
        raise field_problem(
            "task",
            f"Task {name!r} is not on the allow-list CONVEYOR['API_TASKS'], so the API "
            "does not enqueue it.",
        ) from None
    except UnknownTask:
        raise field_problem(
            "task", f"Task {name!r} is allowed by CONVEYOR['API_TASKS'], but no such task exists."
        ) from None


def _check_arguments(task: Task, args: list[Any], kwargs: dict[str, Any]) -> None:
    signature = inspect.signature(task.func)
    try:
        signature.bind(*([None] if task.takes_context else []), *args, **kwargs)
    except TypeError as exc:
        raise field_problem(
            "args", f"The arguments do not fit {task.module_path}(): {exc}."
        ) from None


def _called(task: Task, body: EnqueueIn, key: str | None) -> Task:
    changes: dict[str, Any] = {}
    if body.queue is not None:
        queues = task.get_backend().queues
        if queues and body.queue not in queues:
            raise field_problem(
                "queue",
                f"Queue {body.queue!r} is not one of the backend's QUEUES "
                f"({', '.join(sorted(queues))}).",
            )
        changes["queue_name"] = body.queue
    if body.priority is not None:
        changes["priority"] = body.priority
    if body.run_after is not None:
        if problem := run_after_problem(body.run_after):
            raise field_problem("run_after", problem)
        changes["run_after"] = body.run_after
    if key is not None:
        changes["idempotency_key"] = key
    if body.unique is not None:
        changes["unique"] = body.unique and _unique(body.unique)
    try:
        task = task.using(**changes) if changes else task
    except InvalidTask as exc:
        raise field_problem(None, str(exc)) from None
    for name in ("tags", "meta", "concurrency_key"):
        if (value := getattr(body, name)) is not None:
            try:
                task = task.using(**{name: value})
            except InvalidTask as exc:
                raise field_problem(name, str(exc)) from None
    return task


def _unique(body: UniqueIn) -> Unique:
    try:
        return Unique(
            by=body.by, period=body.period, states=body.states, on_duplicate=body.on_duplicate
        )
    except InvalidTask as exc:
        raise field_problem("unique", str(exc)) from None


def _created_job(task: Task, result: Any, key: str | None) -> dict[str, Any]:
    """The new job as the INSERT wrote it, without reading it back."""
    return {
        "id": result.id,
        "task": task.module_path,
        "queue": task.queue_name,
        "state": JobState.AVAILABLE.value,
        "priority": task.priority,
        "attempt": 0,
        "max_attempts": getattr(task, "max_attempts", None) or conveyor_settings().MAX_ATTEMPTS,
        "run_after": task.run_after or result.enqueued_at,
        "enqueued_at": result.enqueued_at,
        "started_at": None,
        "finished_at": None,
        "args": result.args,
        "kwargs": result.kwargs,
        "idempotency_key": key,
        "return_value": None,
        "errors": [],
        "tags": list(result.tags),
        "meta": result.meta,
        "unique": None,
    }


@router.post(
    "/jobs",
    tags=["jobs"],
    response={201: JobOut, 200: JobOut, 409: ProblemOut, **ERRORS},
    auth=credentials("enqueue"),
    summary="Enqueue a job",
    url_name="enqueue_job",
)
@decorate_view(limit_body)
def enqueue_job(
    request: HttpRequest,
    response: HttpResponse,
    body: EnqueueIn,
    idempotency_key: str | None = Header(
        None,
        alias="Idempotency-Key",
        description="Names this call: the same key and call again returns the same job.",
    ),
) -> Status:
    """201 with the new job; 200 with the existing job when the Idempotency-Key was seen
    with the same task, arguments and queue, or when the call's unique key is held by a
    job (`unique`, or the task's own): that job, with its new arguments under
    on_duplicate 'replace' if it had not started; 409 when the Idempotency-Key was seen
    with another call."""
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_LENGTH:
        raise field_problem(
            "Idempotency-Key",
            f"The Idempotency-Key header must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} characters.",
            location="header",
        )
    task = _resolve(body.task)
    _check_arguments(task, body.args, body.kwargs)
    task = _called(task, body, idempotency_key)
    try:
        result = task.enqueue(*body.args, **body.kwargs)
    except IdempotencyKeyReused as exc:
        database = conveyor_settings().database_for(task.queue_name)
        existing = result_id(database, exc.job_id)
        response["Location"] = _location(existing)
        raise Problem(409, str(exc), job_id=existing) from None
    except ArgumentsNotSerializable as exc:
        raise field_problem("args", str(exc)) from None
    response["Location"] = _location(result.id)
    if result.created and getattr(task, "unique", None) is None:
        return Status(201, _created_job(task, result, idempotency_key))
    database, job = _job(result.id)  # Read back: the key's window comes from the database.
    return Status(201 if result.created else 200, job_out(job, database))


@router.get(
    "/jobs/{job_id}",
    tags=["jobs"],
    response={200: JobOut, **ERRORS},
    auth=credentials("read", "conveyor.view_job"),
    summary="Get a job",
    url_name="get_job",
)
def get_job(request: HttpRequest, job_id: str) -> dict[str, Any]:
    """State, attempts, errors (one per failed attempt) and the return value."""
    database, job = _job(job_id)
    return job_out(job, database)


@router.get(
    "/jobs/{job_id}/logs",
    tags=["jobs"],
    response={200: list[AttemptLogOut], **ERRORS},
    auth=credentials("read", "conveyor.view_job"),
    summary="Get a job's attempt logs",
    url_name="get_job_logs",
)
def get_job_logs(request: HttpRequest, job_id: str) -> list[dict[str, Any]]:
    """The log records each attempt's handler emitted, oldest attempt first."""
    database, job = _job(job_id)
    return [
        {
            "attempt": log.attempt,
            "token": log.lease_version,
            "worker": log.worker,
            "written_at": log.written_at,
            "records": log.records,
            "dropped": log.dropped,
        }
        for log in JobLog.objects.using(database).filter(job_id=job.pk).order_by("lease_version")
    ]


@router.get(
    "/jobs",
    tags=["jobs"],
    response={200: JobPage, **ERRORS},
    auth=credentials("read", "conveyor.view_job"),
    summary="List jobs",
    url_name="list_jobs",
)
def list_jobs(
    request: HttpRequest,
    state: StateName | None = Query(None, description="Only jobs in this state."),
    queue: str | None = Query(None, max_length=64, description="Only jobs of this queue."),
    task: str | None = Query(None, max_length=255, description="Only jobs of this task path."),
    q: str | None = Query(
        None,
        max_length=2000,
        description="A search, as in the admin: `tag:tenant:42 meta.request_id:ab12 "
        "args.0:SKU-1 kwargs.customer_id:42 key:order-7`, or a bare id, key or task path "
        "part; all terms must match (docs/observability.md#search). With `args.`/`kwargs.` "
        "terms a page looks at a bounded window of the newest jobs (SEARCH_SCAN_ROWS): it "
        "may hold fewer than `limit` jobs and still have a `next_cursor`.",
    ),
    unique_key: str | None = Query(
        None,
        pattern="^[0-9a-f]{64}$",
        description="Only jobs with this unique key (every job that held it, in every window).",
    ),
    cursor: str | None = Query(None, description="`next_cursor` of the previous page."),
    limit: int = Query(DEFAULT_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE),
) -> dict[str, Any]:
    """Newest first, a keyset page at a time: stable while jobs are added."""
    for name, value in (("queue", queue), ("task", task)):
        if value is not None and (problem := text_problem(value)):
            raise field_problem(name, f"The {name} filter {value!r:.80} {problem}.", "query")
    try:
        before = listing.decode_cursor(cursor)
    except listing.BadCursor:
        raise field_problem("cursor", "The cursor is not one this API returned.", "query") from None
    try:
        found = search.parse(q or "")
    except search.InvalidSearch as exc:
        raise field_problem("q", str(exc), "query") from None
    settings = conveyor_settings()
    database = settings.database_for(queue) if queue else settings.DATABASE
    # Raw SQL pages take named parameters; a unique key's page is an ORM query.
    where = found.where(known_task_paths(), named=unique_key is None) if found else None
    window = settings.SEARCH_SCAN_ROWS if found.windowed(database, task) else None
    jobs, next_before = listing.page(
        database, state=state, queue=queue, task=task, before=before, limit=limit,
        where=where, window=window, unique_key=unique_key,
    )  # fmt: skip
    return {
        "items": [job_summary(job, database) for job in jobs],
        "next_cursor": listing.encode_cursor(next_before) if next_before else None,
    }


def _key_holder(database: str, job: Job) -> tuple[int, str] | None:
    """The job that holds this job's unique key, if another does."""
    if job.unique_key is None:
        return None
    return operations.key_holders([job.id], database=database).get(job.id)


def _conflict(job_id: str, job: Job, verb: str, allowed: frozenset[JobState]) -> Problem:
    ordered = [s.value for s in JobState if s in allowed]
    names = ", ".join(ordered[:-1]) + f" or {ordered[-1]}"
    return Problem(
        409,
        f"Job {job_id} is {job.state}; only jobs that are {names} can be {verb}.",
        job_id=job_id,
    )


def _operate(
    request: HttpRequest,
    job_id: str,
    action: Callable[..., list[int]],
    verb: str,
    allowed: frozenset[JobState],
) -> dict[str, Any]:
    """Run an operation on one job through `operations`; 409 when its state refuses it."""
    database, job = _job(job_id)
    # The job's history records who asked: "api:<key name>" or "admin:<username>".
    changed = action([job.id], database=database, actor=request.auth.actor)
    job.refresh_from_db(using=database)
    if not changed and job.state in allowed and (holder := _key_holder(database, job)):
        holder_id, holder_state = holder
        raise Problem(
            409,
            f"Job {job_id} was not {verb}: its unique key is held by job "
            f"{result_id(database, holder_id)} ({holder_state}); two jobs cannot hold one key. "
            "Cancel that job, or wait for it to finish, then requeue this one.",
            job_id=job_id,
        )
    if not changed and job.state in allowed:  # REQUEUE's dependency guard refused it.
        raise Problem(
            409,
            f"Job {job_id} depends on a job that is failed, dead or cancelled; requeue that "
            "dependency, and this job follows.",
            job_id=job_id,
        )
    if not changed:
        raise _conflict(job_id, job, verb, allowed)
    logger.info("%s %s job %s", request.auth.actor, verb, job_id)
    return job_out(job, database)


@router.post(
    "/jobs/{job_id}/requeue",
    tags=["jobs"],
    response={200: JobOut, 409: ProblemOut, **ERRORS},
    auth=credentials("operate", "conveyor.change_job"),
    summary="Requeue a failed, dead or cancelled job",
    url_name="requeue_job",
)
def requeue_job(request: HttpRequest, job_id: str) -> dict[str, Any]:
    """Gives the job a fresh set of attempts; 409 unless it is failed, dead or cancelled."""
    return _operate(request, job_id, operations.requeue, "requeued", REQUEUEABLE_STATES)


@router.post(
    "/jobs/{job_id}/cancel",
    tags=["jobs"],
    response={200: JobOut, 202: JobOut, 409: ProblemOut, **ERRORS},
    auth=credentials("operate", "conveyor.change_job"),
    summary="Cancel a job; a running one is asked to stop",
    url_name="cancel_job",
)
def cancel_job(request: HttpRequest, job_id: str) -> Status:
    """200: the job (blocked or available) is cancelled. 202: it is running, and the
    worker holding it is asked to stop it (it ends cancelled within a heartbeat).
    409 once it has finished."""
    database, job = _job(job_id)
    actor = request.auth.actor
    status = 200
    if not operations.cancel([job.id], database=database, actor=actor):
        # Running (or claimed since it was read): ask its worker. A job already
        # asked keeps the first request, and the answer is 202 again.
        status = 202
        operations.request_cancel([job.id], database=database, actor=actor)
    job.refresh_from_db(using=database)
    if status == 202 and not (job.state == JobState.RUNNING and job.cancel_requested_at):
        raise _conflict(job_id, job, "cancelled", CANCELLABLE_STATES | {JobState.RUNNING})
    logger.info("%s %s job %s", actor, "cancelled" if status == 200 else "asked to cancel", job_id)
    return Status(status, job_out(job, database))


@router.post(
    "/jobs/{job_id}/signal",
    tags=["jobs"],
    response={200: JobOut, 409: ProblemOut, **ERRORS},
    auth=credentials("operate", "conveyor.change_job"),
    summary="Send a signal to a gate: its wait ends, and its dependents run",
    url_name="signal_job",
)
def signal_job(request: HttpRequest, job_id: str, body: SignalIn) -> dict[str, Any]:
    """The gate completes with the payload as its result (or, with `reject`, fails).
    400: a bad name or payload. 404: no such job. 409: the job is not a gate that
    waits for this signal now (another name, upstream not done, already signalled,
    timed out, cancelled); the detail says which. Nothing is written then."""
    from ..workflows.gates import reject_signal, send_signal

    database, job = _job(job_id)
    actor = request.auth.actor
    try:
        if body.reject:
            reject_signal(result_id(database, job.id), body.name, reason=body.reason, actor=actor)
        else:
            send_signal(result_id(database, job.id), body.name, body.payload, actor=actor)
    except GateNotFound as exc:
        raise Problem(404, str(exc)) from None
    except GateError as exc:
        raise Problem(409, str(exc), job_id=job_id) from None
    except (ArgumentsNotSerializable, ValueError) as exc:
        field = "reason" if body.reject else ("name" if "signal name" in str(exc) else "payload")
        raise field_problem(field, str(exc)) from None
    job.refresh_from_db(using=database)
    logger.info("%s %s signal %r to job %s", actor, "rejected" if body.reject else "sent",
                body.name, job_id)  # fmt: skip
    return job_out(job, database)


def limits_out(value: limits.Limits) -> dict[str, Any]:
    return value.declared()


def queue_out(entry: queue_counts.QueueCounts) -> dict[str, Any]:
    return {
        "name": entry.name,
        "paused": entry.paused,
        "limits": limits_out(limits.of(entry)),
        "throttled": entry.throttled,
        "jobs": entry.jobs,
        "estimated": sorted(entry.estimated),
        "lag_seconds": entry.lag_seconds,
        "leases_active": entry.leases_active,
        "leases_expired": entry.leases_expired,
    }


@router.get(
    "/queues",
    tags=["queues"],
    response={200: list[QueueOut], **ERRORS},
    auth=credentials("read", "conveyor.view_queue"),
    summary="List queues",
    url_name="list_queues",
)
def list_queues(request: HttpRequest) -> list[dict[str, Any]]:
    """Every queue with its jobs per state, lag, leases, limits and whether it is paused."""
    return [queue_out(q) for q in queue_counts.snapshot(operations.known_queues()).values()]


def _switch(
    request: HttpRequest, name: str, action: Callable[[list[str]], int], verb: str
) -> dict[str, Any]:
    """Pause or resume one queue through `operations`; 404 for a queue nobody names."""
    if name not in operations.known_queues():
        raise Problem(404, f"No queue is named {name!r}.")
    if action([name]):
        logger.info("%s %s queue %s", request.auth.actor, verb, name)
    return queue_out(queue_counts.snapshot([name])[name])


@router.post(
    "/queues/{name}/pause",
    tags=["queues"],
    response={200: QueueOut, **ERRORS},
    auth=credentials("operate", "conveyor.change_queue"),
    summary="Pause a queue",
    url_name="pause_queue",
)
def pause_queue(request: HttpRequest, name: str) -> dict[str, Any]:
    """Workers stop claiming from it; running jobs finish."""
    return _switch(request, name, operations.pause, "paused")


@router.post(
    "/queues/{name}/resume",
    tags=["queues"],
    response={200: QueueOut, **ERRORS},
    auth=credentials("operate", "conveyor.change_queue"),
    summary="Resume a queue",
    url_name="resume_queue",
)
def resume_queue(request: HttpRequest, name: str) -> dict[str, Any]:
    """Workers claim from it again, woken at once."""
    return _switch(request, name, operations.resume, "resumed")


def _limits_in(body: LimitsIn) -> limits.Limits:
    """The body as Limits, refused with limits.py's message naming the field."""
    field = "concurrency"
    try:
        concurrency = limits.positive(body.concurrency, where=field)
        field = "key_concurrency"
        key_concurrency = limits.positive(body.key_concurrency, where=field)
        field = "rate"
        rate = limits.parse_rate(body.rate, where=field)
    except limits.InvalidLimit as exc:
        raise field_problem(field, str(exc)) from None
    return limits.Limits(concurrency, key_concurrency, rate, body.fair)


@router.put(
    "/queues/{name}/limits",
    tags=["queues"],
    response={200: LimitsOut, **ERRORS},
    auth=credentials("operate", "conveyor.change_queue"),
    summary="Set a queue's limits",
    url_name="set_queue_limits",
)
def set_queue_limits(request: HttpRequest, name: str, body: LimitsIn) -> dict[str, Any]:
    """Replaces the queue's limits with the body's (docs/flow-control.md); the next claim
    of the queue obeys them. 400: a bad limit (the field is named; nothing is written).
    404: no queue is named so."""
    if name not in operations.known_queues():
        raise Problem(404, f"No queue is named {name!r}.")
    wanted = _limits_in(body)
    before, after = limits.set_limits(name, wanted, actor=request.auth.actor)
    logger.info("%s set the limits of queue %s from %s to %s", request.auth.actor, name,
                before.describe(), after.describe())  # fmt: skip
    return limits_out(after)
