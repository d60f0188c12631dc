"""Request and response bodies of the HTTP API; the OpenAPI schema is generated from these."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Schema
from pydantic import AwareDatetime, ConfigDict

from ..bounds import MAX_SECONDS
from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY
from ..states import JobState
from ..unique import KEY_LENGTH, OPTIONAL_STATES, PARTS, REQUIRED_STATES

StateName = Literal[tuple(s.value for s in JobState)]  # type: ignore[valid-type]
PartName = Literal[PARTS]  # type: ignore[valid-type]
MAX_PAGE_SIZE = 200
DEFAULT_PAGE_SIZE = 50


class UniqueIn(Schema):
    """Unique jobs (docs/unique-jobs.md): at most one job per key among `states`."""

    model_config = ConfigDict(extra="forbid")

    by: list[PartName] = Field(
        default_factory=lambda: list(PARTS),
        min_length=1,
        description="Which parts of the call make two calls the same job; 'task' is always one.",
    )
    period: int | None = Field(
        None,
        ge=1,
        le=int(MAX_SECONDS),
        strict=True,
        description="Seconds: calls in the same bucket of UTC time (rounded down to a multiple "
        "of the period) are the same job. Null: no period.",
    )
    states: list[StateName] = Field(
        default_factory=lambda: list(REQUIRED_STATES),
        description="States in which an existing job holds the key: blocked, available and "
        f"running, and any of {', '.join(OPTIONAL_STATES)}.",
    )
    on_duplicate: Literal["skip", "replace"] = Field(
        "skip",
        description="'skip': return the existing job. 'replace': an existing job that has not "
        "started takes this call's arguments and run_after (debounce).",
    )


class UniqueOut(Schema):
    """A unique job's key and what it was made of."""

    key: str = Field(max_length=KEY_LENGTH, description="Hex SHA-256 of the parts `by` names.")
    window_start: datetime | None = Field(description="Start of the period bucket; null: none.")
    window_end: datetime | None
    period: int | None
    by: list[str] = Field(description="The parts, and a callable's dotted name.")
    value: Any = Field(None, description="What the callable of `by` returned.")
    states: list[str]
    on_duplicate: str
    replaced: int = Field(0, description="Calls whose arguments replaced this job's.")
    replaced_at: datetime | None = None


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
    unique: UniqueIn | Literal[False] | None = Field(
        None,
        description="One job per key among chosen states; false: none for this call; "
        "absent or null: the task's own.",
    )
    concurrency_key: str | None = Field(
        None,
        description="The key a limited queue's key_concurrency and fair count by "
        "(docs/flow-control.md): text of 1 to 255 characters; absent or null: the task's own.",
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
    unique: UniqueOut | None = Field(None, description="Null: the job has no unique key.")


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


class LimitsOut(Schema):
    """A queue's flow control (docs/flow-control.md); null (false): no such limit."""

    concurrency: int | None = Field(description="Jobs of the queue running at once, at most.")
    rate: str | None = Field(description="Starts per second, minute or hour, e.g. '100/m'.")
    key_concurrency: int | None = Field(
        description="Jobs of one concurrency key running at once, at most."
    )
    fair: bool = Field(description="Keys take turns: each gets a share of every claim.")


class LimitsIn(Schema):
    """A queue's limits, all four: a field left out is no such limit (fair: false)."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = Field(
        None, strict=True, description="1 or more; null: no limit on the queue's running jobs."
    )
    rate: str | None = Field(
        None, description="'N/s', 'N/m' or 'N/h' (N from 1); null: no rate limit."
    )
    key_concurrency: int | None = Field(
        None, strict=True, description="1 or more; null: no limit per concurrency key."
    )
    fair: bool = Field(False, strict=True, description="True: keys take turns.")


class QueueOut(Schema):
    name: str
    paused: bool
    limits: LimitsOut
    throttled: dict[str, int] = Field(
        description="Ready jobs waiting because a limit is reached, per reason (concurrency, "
        "rate, key_concurrency); empty when the queue has no limit or is paused."
    )
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
