"""Flow control: the limits a queue may carry, as declared, stored and changed.

`CONVEYOR["QUEUES"]` declares them; every worker copies the declaration into
`conveyor_queue` when it starts (`sync`), as cron schedules are synced; the
admin, `manage.py conveyor_queues limit` and the HTTP API change them at run
time (`set_limits`). The claim enforces them in its own transaction
(`protocol.CLAIM_LIMITED`, under the queue row's lock): no leader, no
process-local counter, so every worker process and host sees one limit.

A sync writes a queue's limits only when its declaration changed since the
last sync (`declared_limits` keeps it), so an operator's edit stands until
someone changes the settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.utils import timezone

from .bounds import MAX_INT
from .conf import conveyor_settings, raw_settings

PERIODS = {"s": 1, "m": 60, "h": 3600}
RATE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
FIELDS = ("concurrency", "rate", "key_concurrency", "fair")
MAX_QUEUE_NAME = 64  # conveyor_queue.name
HINT = "See docs/flow-control.md for the limits a queue may carry and how to write them."


class InvalidLimit(ValueError):
    """A limit that cannot be enforced; the message names the key and the value."""

    def __init__(self, message: str, *, id: str = "conveyor.E122") -> None:
        super().__init__(message)
        self.id = id


@dataclass(frozen=True, slots=True)
class Rate:
    """At most `count` starts in any `seconds`-long window."""

    count: int
    seconds: int

    def __str__(self) -> str:
        unit = {v: k for k, v in PERIODS.items()}[self.seconds]
        return f"{self.count}/{unit}"


@dataclass(frozen=True, slots=True)
class Limits:
    """A queue's limits; None (False) is no such limit."""

    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: Rate | None = None
    fair: bool = False

    @property
    def any(self) -> bool:
        return (
            self.concurrency is not None
            or self.key_concurrency is not None
            or self.rate is not None
            or self.fair
        )

    def declared(self) -> dict[str, Any]:
        """As CONVEYOR["QUEUES"] spells it (what `declared_limits` stores)."""
        return {
            "concurrency": self.concurrency,
            "rate": None if self.rate is None else str(self.rate),
            "key_concurrency": self.key_concurrency,
            "fair": self.fair,
        }

    def columns(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "key_concurrency": self.key_concurrency,
            "rate_count": None if self.rate is None else self.rate.count,
            "rate_seconds": None if self.rate is None else self.rate.seconds,
            "fair": self.fair,
        }

    def describe(self) -> str:
        """One line for lists and logs: "concurrency 5, rate 100/m", or "none"."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.rate is not None:
            parts.append(f"rate {self.rate}")
        if self.key_concurrency is not None:
            parts.append(f"key_concurrency {self.key_concurrency}")
        if self.fair:
            parts.append("fair")
        return ", ".join(parts) or "none"


def of(queue: Any) -> Limits:
    """The limits a conveyor_queue row holds."""
    rate = None
    if queue.rate_count is not None and queue.rate_seconds in PERIODS.values():
        rate = Rate(queue.rate_count, queue.rate_seconds)
    return Limits(queue.concurrency, queue.key_concurrency, rate, bool(queue.fair))


def parse_rate(value: Any, *, where: str = "rate") -> Rate | None:
    """ "N/s", "N/m" or "N/h" (N >= 1) as a Rate; None or "" is no rate."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and (match := RATE.fullmatch(value)):
        count = int(match.group(1))
        if 1 <= count <= MAX_INT:
            return Rate(count, PERIODS[match.group(2)])
    raise InvalidLimit(
        f"{where} must be a number of starts per second, minute or hour, "
        f'such as "100/m" (N/s, N/m or N/h with N from 1 to {MAX_INT}), not {value!r}.',
        id="conveyor.E123",
    )


def positive(value: Any, *, where: str) -> int | None:
    """A limit of jobs at once: an int from 1 up, or None for none."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT:
        raise InvalidLimit(
            f"{where} must be a whole number of jobs from 1 to {MAX_INT}, or none "
            f"for no limit, not {value!r}.",
        )
    return value


def count_from_text(text: str, *, where: str, blank_is_none: bool = True) -> int | None:
    """A limit typed as text (a form, a command line): a whole number, or blank for none
    (unless `blank_is_none` is False: then blank is refused as any other word)."""
    text = text.strip()
    if not text and blank_is_none:
        return None
    value: Any = int(text) if re.fullmatch(r"[+-]?[0-9]+", text) else text
    return positive(value, where=where)


def fairness(value: Any, *, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidLimit(f"{where} must be True or False, not {value!r}.", id="conveyor.E124")
    return value


def from_mapping(value: Any, *, where: str) -> Limits:
    """A queue's declaration (`{"concurrency": 5, "rate": "100/m", ...}`) as Limits."""
    if not isinstance(value, Mapping):
        raise InvalidLimit(
            f"{where} must be a dict of limits ({', '.join(FIELDS)}), not {type(value).__name__}.",
            id="conveyor.E120",
        )
    unknown = sorted(set(value) - set(FIELDS), key=str)
    if unknown:
        raise InvalidLimit(
            f"{where}[{unknown[0]!r}] is not a queue limit; the limits are {', '.join(FIELDS)}.",
            id="conveyor.E121",
        )
    return Limits(
        concurrency=positive(value.get("concurrency"), where=f"{where}['concurrency']"),
        key_concurrency=positive(value.get("key_concurrency"), where=f"{where}['key_concurrency']"),
        rate=parse_rate(value.get("rate"), where=f"{where}['rate']"),
        fair=fairness(value.get("fair", False), where=f"{where}['fair']"),
    )


@dataclass(frozen=True, slots=True)
class Problem:
    id: str
    message: str


def problems(value: Any) -> list[Problem]:
    """Everything wrong with CONVEYOR["QUEUES"], each naming its key."""
    if not isinstance(value, Mapping):
        return [
            Problem(
                "conveyor.E120",
                f"CONVEYOR['QUEUES'] must be a dict of queue name -> limits, "
                f"not {type(value).__name__}.",
            )
        ]
    found = []
    for name, declaration in value.items():
        where = f"CONVEYOR['QUEUES'][{name!r}]"
        if not isinstance(name, str) or not name or len(name) > MAX_QUEUE_NAME or "\x00" in name:
            found.append(
                Problem(
                    "conveyor.E125",
                    f"{where}: a queue name is text of 1 to {MAX_QUEUE_NAME} characters.",
                )
            )
            continue
        try:
            from_mapping(declaration, where=where)
        except InvalidLimit as exc:
            found.append(Problem(exc.id, str(exc)))
    return found


def declared() -> dict[str, Limits]:
    """The valid declarations of CONVEYOR["QUEUES"] (the system check reports the others)."""
    queues = raw_settings().get("QUEUES") or {}
    found = {}
    for name, value in queues.items() if isinstance(queues, Mapping) else ():
        if isinstance(name, str) and not problems({name: value}):
            found[name] = from_mapping(value, where=name)
    return found


@dataclass(frozen=True, slots=True)
class SyncCounts:
    written: int = 0  # Queues whose limits the declaration set (new or changed declarations).
    kept: int = 0  # Declared queues whose row already had this declaration.
    names: tuple[str, ...] = field(default=())


def sync(database: str, specs: Mapping[str, Limits] | None = None) -> SyncCounts:
    """Write the declared limits of `database`'s queues where their declaration changed.

    A queue whose declaration is the one the row last saw keeps its current
    limits (an operator may have changed them). A queue no longer declared
    keeps what it has: removing limits is an explicit act (admin, command,
    API, or a declaration with every limit None).
    """
    from .models import Queue

    settings = conveyor_settings()
    specs = declared() if specs is None else specs
    mine = {n: s for n, s in specs.items() if settings.database_for(n) == database}
    if not mine:
        return SyncCounts()
    written: list[str] = []
    kept = 0
    with transaction.atomic(using=database):
        Queue.objects.using(database).bulk_create(
            [Queue(name=n) for n in mine], ignore_conflicts=True
        )
        rows = {q.name: q for q in Queue.objects.using(database).select_for_update().filter(
            name__in=list(mine)
        )}  # fmt: skip
        for name, limits in sorted(mine.items()):
            row = rows[name]
            if row.declared_limits == limits.declared():
                kept += 1
                continue
            row.declared_limits = limits.declared()
            _write(row, limits, actor="settings", database=database, also=["declared_limits"])
            written.append(name)
    return SyncCounts(len(written), kept, tuple(written))


def set_limits(name: str, limits: Limits, *, actor: str) -> tuple[Limits, Limits]:
    """Set queue `name`'s limits (creating its row); returns (before, after).

    The next claim of the queue sees them: every claim reads the row.
    """
    from .models import Queue

    database = conveyor_settings().database_for(name)
    with transaction.atomic(using=database):
        Queue.objects.using(database).get_or_create(name=name)
        row = Queue.objects.using(database).select_for_update().get(name=name)
        before = of(row)
        _write(row, limits, actor=actor, database=database)
    return before, limits


def _write(
    row: Any, limits: Limits, *, actor: str, database: str, also: list[str] | None = None
) -> None:
    """Save `limits` (and the fields in `also`) on a locked conveyor_queue row, and who did."""
    columns = limits.columns()
    for key, value in columns.items():
        setattr(row, key, value)
    row.limits_changed_at = timezone.now()
    row.limits_changed_by = actor[:255]
    row.save(
        using=database,
        update_fields=[*columns, "limits_changed_at", "limits_changed_by", *(also or [])],
    )


def current(name: str) -> Limits:
    """The limits queue `name` has now (none when it has no row)."""
    from .models import Queue

    database = conveyor_settings().database_for(name)
    row = Queue.objects.using(database).filter(name=name).first()
    return Limits() if row is None else of(row)
