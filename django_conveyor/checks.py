"""System checks: refuse what would break the guarantees, at start-up.

`check_settings` reports `conf.problems()`, so every CONVEYOR key is checked
from its one declaration in `conf.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core import checks

from .conf import problems, raw_settings, written
from .periodic.schedules import check_cron

__all__ = ["check_cron", "check_database", "check_settings"]


def check_settings(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    for problem in problems(written(), databases=settings.DATABASES):
        yield checks.Error(problem.msg, hint=problem.hint, id=problem.id)


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
