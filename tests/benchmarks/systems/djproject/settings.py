"""Settings for the Django-based systems; BENCH_DJANGO_SYSTEM picks the backend."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

SYSTEM = os.environ.get("BENCH_DJANGO_SYSTEM", "conveyor")


def _database(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": None,  # persistent connections: every system gets them
    }


SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS: list[str] = []
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": _database(os.environ["BENCH_DATABASE_URL"])}

_APPS = {
    "conveyor": "django_conveyor",
    "django-tasks-db": "django_tasks_db",
    "django-ox": "django_ox",
}
_BACKENDS = {
    "conveyor": "django_conveyor.backend.ConveyorBackend",
    "django-tasks-db": "django_tasks_db.backend.DatabaseBackend",
    "django-ox": "django_ox.backend.OxBackend",
}
INSTALLED_APPS = ["django.contrib.contenttypes", _APPS[SYSTEM]]
# django-conveyor's growth workload also uses a queue no worker serves and 100 queues.
_QUEUES = ["default"] + (
    ["backlog"] + [f"q{i}" for i in range(100)] if SYSTEM == "conveyor" else []
)
# django-conveyor's features workload: a queue for each kind of limit, set so
# that no drain of the benchmark reaches it (what the limited claim costs, not
# what a limit holds back); `limit-keys` and `limit-fair` get 1,000 keys.
FEATURE_LIMITS: dict[str, dict[str, Any]] = {
    "limit-concurrency": {"concurrency": 100_000},
    "limit-rate": {"rate": "1000000/s"},
    "limit-keys": {"key_concurrency": 1},
    "limit-fair": {"fair": True},
}
if SYSTEM == "conveyor":
    _QUEUES += list(FEATURE_LIMITS)
    CONVEYOR = {"QUEUES": FEATURE_LIMITS}
TASKS: dict[str, Any] = {
    "default": {"BACKEND": _BACKENDS[SYSTEM], "QUEUES": _QUEUES},
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"django.tasks": {"level": "WARNING"}, "django": {"level": "WARNING"}},
}
