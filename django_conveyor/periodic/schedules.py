"""Periodic schedules: validating them, syncing CONVEYOR["CRON"], operator actions.

A schedule is validated the same way wherever it comes from: `validate()`
backs the system check (each problem an error that names the schedule and
the field) and the admin form (each problem an error on its field). Rows of
`conveyor_cron` live in the database of their queue, next to the jobs their
ticks become. Only `protocol.CRON_ENQUEUE` writes those jobs; this module
writes schedule rows and enqueues "run now" jobs through `protocol.enqueue`.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.core import checks
from django.db import connections, transaction

from .. import protocol
from ..compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, task_backends
from ..conf import conveyor_settings, raw_settings
from ..exceptions import ArgumentsNotSerializable, ConveyorError, UnknownTask
from ..serialization import json_round_trip
from ..tasks import resolve_task
from . import expressions
from .ticks import database_now, tick_job

FIELDS = ("schedule", "task", "timezone", "args", "kwargs", "queue", "priority", "missed")
REQUIRED = ("schedule", "task")
MISSED_POLICIES = ("latest", "all", "skip")
DEFAULT_TIMEZONE = "UTC"
DEFAULT_MISSED = "latest"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
SYNC_LOCK = zlib.crc32(b"django_conveyor.schedules.sync")  # pg_advisory_xact_lock key.

# System check ids, one per kind of bad input (docs/cron.md lists them).
E_NOT_INSTALLED = "conveyor.E100"
E_NAME = "conveyor.E101"
E_ENTRY = "conveyor.E102"
E_FIELD = "conveyor.E103"
E_SCHEDULE = "conveyor.E104"
E_TIMEZONE = "conveyor.E105"
E_TASK = "conveyor.E106"
E_QUEUE = "conveyor.E107"
E_PRIORITY = "conveyor.E108"
E_MISSED = "conveyor.E109"
E_ARGUMENTS = "conveyor.E110"


class ScheduleNotFound(ConveyorError):
    """No schedule has that name."""


@dataclass(frozen=True, slots=True)
class Problem:
    id: str  # The system check id.
    field: str | None  # The schedule's field, None for the schedule as a whole.
    detail: str  # A full sentence about the value.


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A valid schedule, with the task's defaults filled in."""

    name: str
    schedule: str
    task_path: str
    timezone: str = DEFAULT_TIMEZONE
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str = "default"
    priority: int = 0
    missed: str = DEFAULT_MISSED

    def row_values(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "name"}

    def timing(self) -> expressions.Timing:
        return expressions.Timing(self.schedule, self.timezone)


def _task(path: Any) -> tuple[Task | None, str | None]:
    if not isinstance(path, str) or not path:
        return None, f"{path!r} is not a dotted path to a task."
    try:
        obj = resolve_task(path)
    except UnknownTask as exc:
        return None, str(exc)
    from ..backend import ConveyorBackend

    backend = task_backends[obj.backend]
    if not isinstance(backend, ConveyorBackend):
        return None, f"{path!r} uses task backend {obj.backend!r}, which is not a ConveyorBackend."
    return obj, None


def validate(name: Any, entry: Any) -> tuple[ScheduleSpec | None, list[Problem]]:
    """A schedule as a ScheduleSpec, or every problem with it."""
    found: list[Problem] = []
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        found.append(
            Problem(
                E_NAME,
                None,
                "A schedule name is 1 to 100 letters, digits, '.', '_' or '-', starting with "
                f"a letter or digit, not {name!r}.",
            )
        )
    if not isinstance(entry, Mapping):
        return None, [*found, Problem(E_ENTRY, None, f"Must be a dict, not {entry!r:.80}.")]
    for key in sorted(set(entry) - set(FIELDS), key=str):
        found.append(
            Problem(E_FIELD, key, f"Not a field of a schedule (fields: {', '.join(FIELDS)}).")
        )
    for key in REQUIRED:
        if key not in entry:
            found.append(Problem(E_FIELD, key, "Is required."))

    tz = entry.get("timezone", DEFAULT_TIMEZONE)
    try:
        expressions.zone(tz)
    except expressions.InvalidSchedule as exc:
        found.append(Problem(E_TIMEZONE, "timezone", str(exc)))
        tz = DEFAULT_TIMEZONE
    if "schedule" in entry:
        try:
            expressions.Timing(entry["schedule"], tz)
        except expressions.CronNotInstalled as exc:
            found.append(Problem(E_NOT_INSTALLED, "schedule", str(exc)))
        except expressions.InvalidSchedule as exc:
            found.append(Problem(E_SCHEDULE, "schedule", str(exc)))

    task, error = _task(entry.get("task")) if "task" in entry else (None, None)
    if error:
        found.append(Problem(E_TASK, "task", error))
    queue = entry.get("queue", task.queue_name if task else None)
    if "queue" in entry and (not isinstance(queue, str) or not queue):
        found.append(Problem(E_QUEUE, "queue", f"{queue!r} is not a queue name."))
    elif task and isinstance(queue, str):
        known = task_backends[task.backend].queues
        if known and queue not in known:
            found.append(
                Problem(
                    E_QUEUE,
                    "queue",
                    f"{queue!r} is not a queue of task backend {task.backend!r} "
                    f"(its QUEUES: {', '.join(sorted(known))}).",
                )
            )
    priority = entry.get("priority", task.priority if task else 0)
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY
    ):
        found.append(
            Problem(
                E_PRIORITY,
                "priority",
                f"Must be a whole number from {TASK_MIN_PRIORITY} to {TASK_MAX_PRIORITY}, "
                f"not {priority!r}.",
            )
        )
    missed = entry.get("missed", DEFAULT_MISSED)
    if missed not in MISSED_POLICIES:
        found.append(
            Problem(
                E_MISSED, "missed", f"Must be one of {', '.join(MISSED_POLICIES)}, not {missed!r}."
            )
        )
    values = {}
    for key, kind, default in (("args", (list, tuple), []), ("kwargs", dict, {})):
        value = entry.get(key, default)
        if not isinstance(value, kind):
            expected = "a list" if key == "args" else "a dict"
            found.append(Problem(E_ARGUMENTS, key, f"Must be {expected}, not {value!r:.80}."))
            continue
        try:
            values[key] = json_round_trip(list(value) if key == "args" else value, key)
        except ArgumentsNotSerializable as exc:
            found.append(Problem(E_ARGUMENTS, key, str(exc)))
    if found or task is None:
        return None, found
    return (
        ScheduleSpec(
            name=name,
            schedule=entry["schedule"],
            task_path=entry["task"],
            timezone=tz,
            args=values["args"],
            kwargs=values["kwargs"],
            queue=queue,
            priority=priority,
            missed=missed,
        ),
        [],
    )


def declared() -> dict[str, ScheduleSpec]:
    """The valid schedules of CONVEYOR["CRON"] (the system check reports the others)."""
    entries = raw_settings().get("CRON") or {}
    specs = {}
    for name, entry in entries.items() if isinstance(entries, dict) else ():
        spec, _ = validate(name, entry)
        if spec is not None:
            specs[name] = spec
    return specs


def check_cron(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    """System check: every schedule of CONVEYOR["CRON"], each problem with its id."""
    entries = raw_settings().get("CRON")
    if not isinstance(entries, dict) or not entries:
        return  # Not a dict: the settings check reports it.
    if not expressions.installed():
        yield checks.Error(
            f"CONVEYOR['CRON'] declares {len(entries)} schedule(s), but the cronsim package "
            "is not installed.",
            hint=expressions.INSTALL_HINT,
            id=E_NOT_INSTALLED,
        )
        return
    for name, entry in entries.items():
        for problem in validate(name, entry)[1]:
            key = f"CONVEYOR['CRON'][{name!r}]"
            if problem.field is not None:
                key += f"[{problem.field!r}]"
            yield checks.Error(f"{key}: {problem.detail}", id=problem.id)


# -- rows ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SyncCounts:
    added: int = 0
    updated: int = 0
    disabled: int = 0


def first_tick(spec: ScheduleSpec | Any, now: datetime) -> datetime | None:
    """The first tick after `now`; None for a row whose expression no longer parses."""
    try:
        return expressions.Timing(spec.schedule, spec.timezone).next_after(now)
    except expressions.InvalidSchedule:
        return None


def sync(database: str, specs: Mapping[str, ScheduleSpec] | None = None) -> SyncCounts:
    """Make the settings-owned rows of `database` match CONVEYOR["CRON"].

    Declared schedules whose queue lives in `database` are added or updated
    (a changed expression or zone restarts from now, so no tick counts as
    missed); rows no longer declared are disabled and kept with their
    history, and become ordinary rows an operator may edit or delete. An
    operator's enable/disable of a declared row survives restarts. One
    worker at a time syncs a database (an advisory lock).
    """
    from ..models import Cron

    settings = conveyor_settings()
    specs = declared() if specs is None else specs
    mine = {n: s for n, s in specs.items() if settings.database_for(s.queue) == database}
    added = updated = disabled = 0
    with transaction.atomic(using=database):
        with connections[database].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [SYNC_LOCK])
            now = database_now(cursor)
        rows = {c.name: c for c in Cron.objects.using(database).select_for_update()}
        for name, spec in mine.items():
            row = rows.get(name)
            values = spec.row_values()
            if row is None:
                Cron.objects.using(database).create(
                    name=name, declared=True, next_tick_at=first_tick(spec, now), **values
                )
                added += 1
                continue
            changed = {k for k, v in values.items() if getattr(row, k) != v}
            if not changed and row.declared:
                continue
            restart = not row.declared or bool(changed & {"schedule", "timezone"})
            for key, value in values.items():
                setattr(row, key, value)
            if not row.declared:  # Added again, or adopted from the admin: settings own it.
                row.declared = row.enabled = True
            if restart:
                row.next_tick_at = first_tick(spec, now)
            row.save(using=database)
            updated += 1
        for name, row in rows.items():
            if row.declared and name not in mine:
                row.declared = row.enabled = False
                row.save(using=database, update_fields=["declared", "enabled", "updated_at"])
                disabled += 1
    return SyncCounts(added, updated, disabled)


def find(name: str, database: str | None = None) -> tuple[Any, str]:
    """The schedule's row and its database (every conveyor database is searched)."""
    from ..models import Cron

    aliases = [database] if database else conveyor_settings().databases()
    for alias in aliases:
        row = Cron.objects.using(alias).filter(name=name).first()
        if row is not None:
            return row, alias
    raise ScheduleNotFound(f"No schedule is named {name!r}.")


def set_enabled(name: str, enabled: bool, *, database: str | None = None) -> bool:
    """Enable or disable a schedule; True if it changed.

    Ticks that fell while it was disabled are missed ticks when it is
    enabled again: its `missed` policy decides what runs. Enabling a
    schedule the scheduler stopped restarts it from now.
    """
    from ..models import Cron

    row, alias = find(name, database)
    with transaction.atomic(using=alias):
        row = Cron.objects.using(alias).select_for_update().get(pk=row.pk)
        stopped = row.next_tick_at is None  # Stopped by the scheduler: enabling restarts it.
        if row.enabled == enabled and not (enabled and stopped):
            return False
        row.enabled = enabled
        if enabled and row.next_tick_at is None:
            with connections[alias].cursor() as cursor:
                row.next_tick_at = first_tick(row, database_now(cursor))
        row.save(using=alias, update_fields=["enabled", "next_tick_at", "updated_at"])
    return True


def run_now(name: str, *, database: str | None = None) -> protocol.Enqueued:
    """Enqueue one extra job of the schedule now; its ticks are not touched.

    Its key is `cron:<name>:manual:<UTC instant of the request>`, so it never
    takes the place of a tick's job.
    """
    row, alias = find(name, database)
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        at = database_now(cursor).astimezone(UTC).replace(tzinfo=None).isoformat()
        job = tick_job(row)
        keyed = protocol.NewJob(**{**asdict(job), "idempotency_key": f"cron:{name}:manual:{at}Z"})
        return protocol.enqueue(cursor, [keyed], notify=conveyor_settings().NOTIFY)[0]
