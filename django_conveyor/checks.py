"""System checks: refuse what would break the guarantees, at start-up."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from typing import Any

from django.conf import settings
from django.core import checks

from .conf import (
    DEFAULT_HEARTBEAT_SECONDS,
    DEFAULT_LEASE_SECONDS,
    SETTING_TYPES,
    ConveyorSettings,
    raw_settings,
)
from .schedules import check_cron

__all__ = ["check_cron", "check_database", "check_settings"]


def check_settings(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    value = getattr(settings, "CONVEYOR", {})
    if not isinstance(value, dict):
        yield checks.Error(
            f"CONVEYOR must be a dict, not {type(value).__name__}.", id="conveyor.E001"
        )
        return
    known = {f.name for f in fields(ConveyorSettings)}
    for key, val in raw_settings().items():
        if key not in known:
            yield checks.Error(
                f"CONVEYOR[{key!r}] is not a setting of django-conveyor.",
                hint=f"Known keys: {', '.join(sorted(known))}.",
                id="conveyor.E002",
            )
            continue
        types = SETTING_TYPES[key]
        if (isinstance(val, bool) and bool not in types) or not isinstance(val, types):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            yield checks.Error(
                f"CONVEYOR[{key!r}] must be {names}, not {type(val).__name__} {val!r}.",
                id="conveyor.E003",
            )
            continue
        if isinstance(val, int | float) and not isinstance(val, bool):
            minimum = 1 if key == "MAX_ATTEMPTS" else 0
            positive = key.endswith("_SECONDS") and key != "SHUTDOWN_TIMEOUT_SECONDS"
            if val < minimum or (positive and val <= 0):
                yield checks.Error(
                    f"CONVEYOR[{key!r}] must be "
                    f"{'more than 0' if positive else f'{minimum} or more'}, not {val!r}.",
                    id="conveyor.E004",
                )
    yield from _check_timing(raw_settings())
    database = raw_settings().get("DATABASE", "default")
    if isinstance(database, str) and database not in settings.DATABASES:
        yield checks.Error(
            f"CONVEYOR['DATABASE'] names {database!r}, which is not in DATABASES.",
            id="conveyor.E005",
        )
    shards = raw_settings().get("QUEUE_DATABASES", {})
    if isinstance(shards, dict):
        for queue, alias in shards.items():
            if not isinstance(queue, str) or not isinstance(alias, str):
                yield checks.Error(
                    f"CONVEYOR['QUEUE_DATABASES'] must map queue names to database aliases "
                    f"(strings), not {queue!r}: {alias!r}.",
                    id="conveyor.E007",
                )
            elif alias not in settings.DATABASES:
                yield checks.Error(
                    f"CONVEYOR['QUEUE_DATABASES'][{queue!r}] names {alias!r}, which is not "
                    "in DATABASES.",
                    id="conveyor.E007",
                )


def _check_timing(values: dict[str, Any]) -> Iterable[checks.CheckMessage]:
    lease = values.get("LEASE_SECONDS", DEFAULT_LEASE_SECONDS)
    beat = values.get("HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS)
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lease, beat))
    if numbers and beat * 2 > lease:
        yield checks.Error(
            f"CONVEYOR['HEARTBEAT_SECONDS'] ({beat}) must be at most half of "
            f"CONVEYOR['LEASE_SECONDS'] ({lease}), or one late heartbeat loses the lease.",
            id="conveyor.E006",
        )


def check_database(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    raw = raw_settings()
    shards = raw.get("QUEUE_DATABASES", {})
    aliases = [raw.get("DATABASE", "default")]
    aliases += list(shards.values()) if isinstance(shards, dict) else []
    for database in dict.fromkeys(a for a in aliases if isinstance(a, str)):
        entry = settings.DATABASES.get(database)
        if entry is None:
            continue
        engine = entry.get("ENGINE", "")
        if engine != "django.db.backends.postgresql" and not engine.endswith(".postgresql"):
            yield checks.Error(
                f"django-conveyor needs PostgreSQL, but DATABASES[{database!r}] uses {engine!r}.",
                hint="Point it at PostgreSQL 14 or newer (ENGINE 'django.db.backends.postgresql').",
                id="conveyor.E020",
            )
