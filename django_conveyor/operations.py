"""Operator actions on jobs and queues, shared by the admin, the CLI and code.

Job state changes go through `protocol`; each function is one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connections, transaction
from django.utils import timezone

from . import protocol
from .compat import task_backends
from .conf import conveyor_settings


def _database() -> str:
    return conveyor_settings().DATABASE


def requeue(ids: Sequence[int], *, database: str | None = None) -> list[int]:
    """Give failed, dead or cancelled jobs a fresh set of attempts; returns those changed."""
    database = database or _database()
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return protocol.requeue(cursor, ids=list(ids), notify=conveyor_settings().NOTIFY)


def cancel(ids: Sequence[int], *, database: str | None = None) -> list[int]:
    """Cancel jobs that have not started; returns those changed."""
    database = database or _database()
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        return protocol.cancel(cursor, ids=list(ids))


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
