"""Request and response bodies of the HTTP API; the OpenAPI schema is generated from these."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema
from pydantic import AwareDatetime, ConfigDict

from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from ..states import JobState

StateName = Literal[tuple(s.value for s in JobState)]  # type: ignore[valid-type]
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


class EnqueueIn(Schema):
    """A call of one task on the allow-list (`CONVEYOR["API_TASKS"]`)."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        min_length=1, max_length=255, description="Task path, e.g. 'shop.tasks.send_receipt'."
    )
    args: list[Any] = Field(default_factory=list, description="Positional arguments (JSON).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments (JSON).")
    queue: str | None = Field(
        None, min_length=1, max_length=64, description="Default: the task's own queue."
    )
    priority: int | None = Field(
        None,
        ge=TASK_MIN_PRIORITY,
        le=TASK_MAX_PRIORITY,
        strict=True,
        description="Higher runs first; default: the task's own priority.",
    )
    run_after: AwareDatetime | None = Field(
        None, description="Run no earlier than this (ISO 8601 with a time zone)."
    )
    tags: list[Any] | None = Field(
        None,
        description="Labels to find the job by (`tag:` in `q`), added to the task's own: "
        "strings of 1 to 64 characters, at most 32 in all.",
    )
    meta: dict[str, Any] | None = Field(
        None, description="Metadata (a JSON object of at most 4,096 bytes; `meta.<key>:` in `q`)."
    )


class JobError(Schema):
    """One failed attempt."""

    attempt: int | None = None
    worker: str | None = None
    exception_class_path: str = ""
    traceback: str = ""
    time: str | None = None


class ProgressOut(Schema):
    """What the handler reported; written by the worker's heartbeat (docs/observability.md)."""

    current: float
    total: float | None = Field(None, description="Null when the handler did not say.")
    message: str | None = None
    attempt: int | None = Field(None, description="The attempt that reported it.")
    updated_at: datetime | None = Field(None, description="Database time of the write.")


class JobSummary(Schema):
    id: str = Field(description="The job id: a number, or 'alias:number' in a sharded queue.")
    task: str
    queue: str
    state: StateName
    priority: int
    attempt: int
    max_attempts: int
    run_after: datetime
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    tags: list[str] = Field(default_factory=list, description="The job's tags (task's first).")


class JobOut(JobSummary):
    args: list[Any]
    kwargs: dict[str, Any]
    idempotency_key: str | None
    return_value: Any = Field(None, description="What the handler returned, once completed.")
    errors: list[JobError]
    cancel_requested_at: datetime | None = Field(
        None, description="When an operator asked the running job's worker to stop it."
    )
    cancel_requested_by: str | None = Field(
        None, description="Who asked: 'api:<key name>', 'admin:<username>', 'cli' or 'code'."
    )
    gate: dict[str, Any] | None = Field(
        None,
        description="For a gate (a workflow step no handler runs): what it waits for, e.g. "
        "{'kind': 'signal', 'signal': 'approval', 'seconds': 172800, 'on_timeout': 'fail'}.",
    )
    gate_deadline: datetime | None = Field(
        None, description="For a gate that waits: when its timeout or timer fires."
    )
    progress: ProgressOut | None = Field(
        None, description="What a running handler last reported (context.set_progress)."
    )
    meta: dict[str, Any] = Field(
        default_factory=dict, description="The job's metadata (with `traceparent` if traced)."
    )


class SignalIn(Schema):
    """A signal to a gate: it ends the gate's wait (docs/workflows.md)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, description="The signal the gate waits for.")
    payload: Any = Field(
        None, description="JSON, at most 64 KiB; the gate's result, read by its dependents."
    )
    reject: bool = Field(
        False, strict=True, description="True: end the wait failed (a rejected approval)."
    )
    reason: str = Field("", max_length=1000, description="Why, for a rejection.")


class LogRecordOut(Schema):
    time: str = Field(description="When the record was emitted (ISO 8601, UTC).")
    level: str
    logger: str
    message: str = Field(description="The formatted message, with its traceback if any.")


class AttemptLogOut(Schema):
    """The log records one attempt's handler emitted (docs/observability.md)."""

    attempt: int
    token: int = Field(description="The attempt's fencing token (lease version).")
    worker: str
    written_at: datetime = Field(description="When its outcome was written.")
    records: list[LogRecordOut]
    dropped: int = Field(description="Records past the 64 KiB bound: counted, not kept.")


class JobPage(Schema):
    items: list[JobSummary]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next (older) page; null on the last page."
    )


class QueueOut(Schema):
    name: str
    paused: bool
    jobs: dict[str, int] = Field(description="Jobs per state (see `estimated`).")
    estimated: list[str] = Field(
        description="States whose count is PostgreSQL's estimate (finished states above 10,000)."
    )
    lag_seconds: float = Field(description="Age of the oldest ready job; 0 when none is ready.")
    leases_active: int
    leases_expired: int = Field(description="Running jobs whose lease expired (to be reaped).")


class FieldError(Schema):
    field: str | None = Field(description="The field at fault, e.g. 'priority'; null for all.")
    location: str | None = Field(None, description="'body', 'query', 'path' or 'header'.")
    message: str


class Problem(Schema):
    """An error, after RFC 9457 (problem details)."""

    status: int
    title: str
    detail: str
    errors: list[FieldError] = Field(default_factory=list)
    job_id: str | None = Field(None, description="For 409: the job the request is about.")
