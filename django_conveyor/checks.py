"""System checks: refuse what would break the guarantees, at start-up.

`check_settings` reports `conf.problems()`, so every CONVEYOR key is checked
from its one declaration in `conf.py`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core import checks
from django.utils.module_loading import import_string

from . import limits
from .conf import not_postgresql, problems, raw_settings, written
from .periodic.schedules import check_cron

__all__ = ["check_backend", "check_cron", "check_database", "check_queues", "check_settings"]

CONVEYOR_BACKEND = "django_conveyor.backend.ConveyorBackend"
DEFAULT_BACKEND = "django.tasks.backends.immediate.ImmediateBackend"  # Django's, without TASKS.


def check_settings(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    for problem in problems(written(), databases=settings.DATABASES):
        yield checks.Error(problem.msg, hint=problem.hint, id=problem.id)


def check_queues(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    """CONVEYOR["QUEUES"]: every limit that cannot be enforced, naming its key."""
    queues = raw_settings().get("QUEUES")
    if queues is None:
        return
    for problem in limits.problems(queues):
        yield checks.Error(problem.message, hint=limits.HINT, id=problem.id)


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
                not_postgresql(database, engine),
                hint="Point it at PostgreSQL 14 or newer (ENGINE 'django.db.backends.postgresql').",
                id="conveyor.E020",
            )


def check_backend(**kwargs: Any) -> Iterable[checks.CheckMessage]:
    """The app is installed but no TASKS alias uses ConveyorBackend: say so, once.

    Without it, `@task` functions run on Django's default backend (in the
    process that enqueues them), and no job ever reaches conveyor_job.
    """
    from .backend import ConveyorBackend

    aliases = getattr(settings, "TASKS", None) or {"default": {"BACKEND": DEFAULT_BACKEND}}
    if not isinstance(aliases, dict):
        return  # Django's own check reports a TASKS that is not a dict.
    used = {}
    for alias, entry in aliases.items():
        path = entry.get("BACKEND") if isinstance(entry, dict) else None
        try:
            backend = import_string(path) if isinstance(path, str) else None
        except ImportError:
            backend = None  # Django's own check names a backend that does not import.
        if isinstance(backend, type) and issubclass(backend, ConveyorBackend):
            return
        used[alias] = path
    shown = ", ".join(f"{alias!r} uses {path}" for alias, path in used.items()) or "none is set"
    yield checks.Warning(
        f"django_conveyor is installed, but no TASKS alias uses ConveyorBackend ({shown}): "
        "@task functions run there, and no job reaches conveyor_job or a worker.",
        hint=f'Set TASKS = {{"default": {{"BACKEND": "{CONVEYOR_BACKEND}"}}}} in your settings.',
        id="conveyor.W011",
    )
