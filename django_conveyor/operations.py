"""Operator actions on jobs and queues, shared by the admin, the CLI and code.

Job state changes go through `protocol`; each function is one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from django.db import connections, transaction
from django.utils import timezone

from . import protocol
from .compat import task_backends
from .conf import conveyor_settings
from .serialization import to_json

BATCH_SIZE = 1000  # Jobs per transaction in a bulk operation.


def requeue(
    ids: Sequence[int], *, database: str | None = None, actor: str = protocol.DEFAULT_ACTOR
) -> list[int]:
    """Give failed, dead or cancelled jobs a fresh set of attempts; returns those changed.

    `actor` names who asked ("admin:<username>", "cli", "api:<key name>") in
    each job's history.
    """
    database = database or conveyor_settings().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return protocol.requeue(
            cursor, ids=list(ids), notify=conveyor_settings().NOTIFY, actor=actor
        )


def key_holders(ids: Sequence[int], *, database: str | None = None) -> dict[int, tuple[int, str]]:
    """Of these jobs, those whose unique key another job holds: {id: (holder id, its state)}.

    Why REQUEUE refused them (docs/unique-jobs.md).
    """
    database = database or conveyor_settings().DATABASE
    with connections[database].cursor() as cursor:
        return protocol.key_holders(cursor, ids=list(ids))


def cancel(
    ids: Sequence[int], *, database: str | None = None, actor: str = protocol.DEFAULT_ACTOR
) -> list[int]:
    """Cancel jobs that have not started; returns those changed."""
    database = database or conveyor_settings().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return protocol.cancel(cursor, ids=list(ids), actor=actor)


def request_cancel(
    ids: Sequence[int], *, database: str | None = None, actor: str = protocol.DEFAULT_ACTOR
) -> list[int]:
    """Ask the workers holding these running jobs to stop them; returns those asked.

    The holder learns it with its next heartbeat and ends the job `cancelled`;
    if the holder is gone, the reaper cancels the job when its lease expires.
    """
    database = database or conveyor_settings().DATABASE
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return protocol.request_cancel(cursor, ids=list(ids), actor=actor)


def approve(
    ids: Sequence[int], *, database: str | None = None, actor: str = protocol.DEFAULT_ACTOR
) -> list[int]:
    """Send each waiting signal gate the signal it waits for, with an approval payload.

    The payload is `{"approved": true, "by": actor}`; returns the gates whose
    wait ended (the others no longer waited, or wait for no signal).
    """
    return _signal_each(ids, database, actor, reject=False)


def reject(
    ids: Sequence[int], *, database: str | None = None, actor: str = protocol.DEFAULT_ACTOR
) -> list[int]:
    """End the wait of each waiting signal gate as failed (rejected by `actor`)."""
    return _signal_each(ids, database, actor, reject=True)


def _signal_each(
    ids: Sequence[int], database: str | None, actor: str, *, reject: bool
) -> list[int]:
    database = database or conveyor_settings().DATABASE
    payload = to_json({"approved": True, "by": actor}, "the approval's payload")
    ended = []
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        for id_ in ids:
            found = protocol.gate_state(cursor, gate_id=id_)
            gate = found[2] if found else None
            name = gate.get("signal") if isinstance(gate, dict) else None  # Unreadable: skipped.
            if name and protocol.signal(
                cursor, gate_id=id_, name=name, payload=None if reject else payload,
                reject=reject, reason="rejected in the admin" if reject else None, actor=actor,
            ):  # fmt: skip
                ended.append(id_)
    return ended


def in_batches(
    action: Callable[..., list[int]], ids: Iterable[int], *, batch_size: int = BATCH_SIZE, **kw: Any
) -> list[int]:
    """Run a job operation over many ids, one transaction per batch; returns those changed.

    Row locks are held for one batch at a time, so a bulk requeue of every
    dead job never stalls the workers' claims for long.
    """
    changed: list[int] = []
    batch: list[int] = []
    for id_ in ids:
        batch.append(id_)
        if len(batch) >= batch_size:
            changed += action(batch, **kw)
            batch = []
    if batch:
        changed += action(batch, **kw)
    return changed


def known_queues() -> set[str]:
    """Every queue named by a ConveyorBackend in TASKS, plus those already in conveyor_queue."""
    from .backend import ConveyorBackend
    from .models import Queue

    names: set[str] = set()
    for backend in task_backends.all():
        if isinstance(backend, ConveyorBackend):
            names |= set(backend.queues)
    for database in conveyor_settings().databases():
        names |= set(Queue.objects.using(database).values_list("name", flat=True))
    return names


def _by_database(names: Iterable[str]) -> dict[str, list[str]]:
    """Queue names grouped by the alias whose conveyor_queue the claims read."""
    settings = conveyor_settings()
    grouped: dict[str, list[str]] = {}
    for name in names:
        grouped.setdefault(settings.database_for(name), []).append(name)
    return grouped


def ensure_queues(names: Iterable[str]) -> None:
    from .models import Queue

    for database, group in _by_database(names).items():
        Queue.objects.using(database).bulk_create(
            [Queue(name=n) for n in group], ignore_conflicts=True
        )


def pause(names: Iterable[str]) -> int:
    """Stop workers claiming from these queues (running jobs finish)."""
    from .models import Queue

    names = list(names)
    ensure_queues(names)
    changed = 0
    for database, group in _by_database(names).items():
        changed += (
            Queue.objects.using(database)
            .filter(name__in=group, paused=False)
            .update(paused=True, paused_at=timezone.now())
        )
    return changed


def resume(names: Iterable[str]) -> int:
    """Let workers claim from these queues again, and wake them."""
    from .models import Queue

    changed = 0
    for database, group in _by_database(names).items():
        with transaction.atomic(using=database):
            changed += (
                Queue.objects.using(database)
                .filter(name__in=group, paused=True)
                .update(paused=False, paused_at=None)
            )
            with connections[database].cursor() as cursor:
                for name in group:
                    cursor.execute(
                        protocol.NOTIFY, {"channel": protocol.NOTIFY_CHANNEL, "queue": name}
                    )
    return changed
