"""What the job page shows besides the columns: attempts, history, payloads, uniqueness."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.html import format_html

from .. import operations
from ..models import Job
from ..states import JobState
from ..unique import Kept

CANCELLED = "django_conveyor.exceptions.Cancelled"
LEASE_LOST = "django_conveyor.exceptions.LeaseLost"
DISCARD = "django_conveyor.exceptions.Discard"
TIMEOUT = "builtins.TimeoutError"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One row of the job page's timeline."""

    number: int | None
    worker: str | None
    started_at: datetime | None
    ended_at: datetime | None
    outcome: str
    error_class: str = ""
    traceback: str = ""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    time: datetime | None
    actor: str
    action: str
    detail: str


def _time(value: Any) -> datetime | None:
    return parse_datetime(value) if isinstance(value, str) else None


def _error_outcome(error_class: str, last: bool, state: str) -> str:
    if error_class == CANCELLED:
        return "cancelled"
    if last and state == JobState.DEAD:
        return "lease lost: dead" if error_class == LEASE_LOST else "dead: attempts used up"
    if last and state == JobState.FAILED:
        return "failed: not retried"
    if error_class == LEASE_LOST:
        return "lease lost: taken back"
    if error_class == TIMEOUT:
        return "timed out: retried"
    return "raised: retried"


def attempts(job: Job) -> list[Attempt]:
    """Every attempt the row remembers, oldest first: its errors, then the current one."""
    errors = job.errors or []
    rows = [
        Attempt(
            number=e.get("attempt"),
            worker=e.get("worker"),
            started_at=_time(e.get("started_at")),
            ended_at=_time(e.get("time")),
            outcome=_error_outcome(
                e.get("exception_class_path") or "", i == len(errors) - 1, job.state
            ),
            error_class=e.get("exception_class_path") or "",
            traceback=e.get("traceback") or "",
        )
        for i, e in enumerate(errors)
    ]
    if job.state == JobState.RUNNING:
        outcome = "running, cancel requested" if job.cancel_requested_at else "running"
        rows.append(Attempt(job.attempt, job.lease_owner, job.started_at, None, outcome))
    elif job.state == JobState.COMPLETED:
        rows.append(
            Attempt(job.attempt, job.lease_owner, job.started_at, job.finished_at, "completed")
        )
    return rows


def history(job: Job) -> list[HistoryEntry]:
    return [
        HistoryEntry(
            _time(e.get("time")), e.get("actor", ""), e.get("action", ""), e.get("detail", "")
        )
        for e in job.history or []
    ]


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return format_html("<pre class='conveyor-json'>{}</pre>", text)


@dataclass(frozen=True, slots=True)
class Uniqueness:
    """A unique job's key, what it was made of, and which job holds it now."""

    key: str
    window_start: datetime | None
    window_end: datetime | None
    period: int | None
    by: list[str]
    value: Any  # What the callable of `by` returned (derived from the arguments).
    states: list[str]
    on_duplicate: str
    replaced: int
    replaced_at: datetime | None
    holds_it: bool  # This job holds the key now.
    holder: tuple[int, str] | None  # Else the job that does, and its state (None: no job).


def uniqueness(job: Job, database: str) -> Uniqueness | None:
    if job.unique_key is None:
        return None
    kept = Kept.of(job.uniqueness)
    start = job.unique_window
    holds_it = job.state in Kept.states_of(job.unique_states)
    holder = None if holds_it else operations.key_holders([job.pk], database=database).get(job.pk)
    return Uniqueness(
        key=job.unique_key,
        window_start=start,
        window_end=start + timedelta(seconds=kept.period) if start and kept.period else None,
        period=kept.period,
        by=kept.by,
        value=kept.value,
        states=Kept.states_of(job.unique_states),
        on_duplicate=kept.on_duplicate,
        replaced=kept.replaced,
        replaced_at=_time(kept.replaced_at),
        holds_it=holds_it,
        holder=holder,
    )
