"""What the job page shows besides the columns: attempts, history, payloads, uniqueness."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join

from .. import operations
from ..bounds import instant_breach
from ..models import Job, JobLog
from ..observability.progress import Progress
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
    token: int | None = None  # The attempt's lease version: its log's key.
    log: list[dict[str, Any]] | None = None  # The records it logged (conveyor_job_log).
    log_dropped: int = 0  # Records past the bound, counted, not kept.


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    time: datetime | None
    actor: str
    action: str
    detail: str


def _time(value: Any) -> datetime | None:
    """A time an entry records; None for one that is not a time every zone can show."""
    try:
        parsed = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # Well-formed but impossible (year 0, month 13): a row written by hand.
        return None
    return parsed if parsed is None or not instant_breach(parsed) else None


def _entries(values: Any) -> list[dict[str, Any]]:
    """A JSON list of entries as dicts, whatever a row written by hand holds."""
    if not isinstance(values, list):
        return []
    return [e if isinstance(e, dict) else {"traceback": str(e)} for e in values]


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


def attempts(job: Job, database: str) -> list[Attempt]:
    """Every attempt the row remembers, oldest first, each with the records it logged."""
    logs = {
        version: (records, dropped)
        for version, records, dropped in JobLog.objects.using(database)
        .filter(job_id=job.pk)
        .values_list("lease_version", "records", "dropped")
    }
    return [
        replace(a, log=logs[a.token][0], log_dropped=logs[a.token][1]) if a.token in logs else a
        for a in _attempts(job)
    ]


def _attempts(job: Job) -> list[Attempt]:
    """Every attempt the row remembers, oldest first: its errors, then the current one."""
    errors = _entries(job.errors)
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
            token=e.get("token"),
        )
        for i, e in enumerate(errors)
    ]
    if job.state == JobState.RUNNING:
        outcome = "running, cancel requested" if job.cancel_requested_at else "running"
        rows.append(
            Attempt(
                job.attempt, job.lease_owner, job.started_at, None, outcome, token=job.lease_version
            )
        )
    elif job.state == JobState.COMPLETED:
        rows.append(
            Attempt(
                job.attempt,
                job.lease_owner,
                job.started_at,
                job.finished_at,
                "completed",
                token=job.lease_version,
            )
        )
    return rows


def history(job: Job) -> list[HistoryEntry]:
    return [
        HistoryEntry(
            _time(e.get("time")), e.get("actor", ""), e.get("action", ""), e.get("detail", "")
        )
        for e in _entries(job.history)
    ]


def pretty_json(value: Any) -> str:
    # default=str: a number past Python's limits is a Decimal (readable.py).
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return format_html("<pre class='conveyor-json'>{}</pre>", text)


def tag_chips(tags: Any, list_url: str) -> str:
    """A job's tags as chips, each linking to the search `tag:<tag>` of the job list."""
    if not isinstance(tags, list) or not tags:
        return "-"
    return format_html_join(
        " ",
        "<a class='conveyor-tag' href='{}?{}'>{}</a>",
        ((list_url, urlencode({"q": f'tag:"{_quoted(tag)}"'}), tag) for tag in tags),
    )


def _quoted(value: str) -> str:
    """`value` inside the search syntax's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def progress_bar(job: Job) -> str:
    """What the handler last reported: a bar (with a total), the numbers, the message, when."""
    progress = Progress.of(job.progress)
    if progress is None:
        return "none reported"
    numbers = f"{progress.current:g}" + (f" of {progress.total:g}" if progress.total else "")
    when = f"{progress.updated_at:%Y-%m-%d %H:%M:%S}" if progress.updated_at else "?"
    bar = (
        format_html(
            "<progress class='conveyor-progress' max='100' value='{}'>{}%</progress> {}% ",
            progress.percent,
            progress.percent,
            progress.percent,
        )
        if progress.percent is not None
        else ""
    )
    return format_html(
        "<span class='conveyor-progress-report'>{}{}{} "
        "<span class='conveyor-note'>(attempt {}, {})</span></span>",
        bar,
        numbers,
        f": {progress.message}" if progress.message else "",
        progress.attempt if progress.attempt is not None else "?",
        when,
    )


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
