"""The one place that reads `settings.CONVEYOR`.

Every key has a documented default below; `checks.py` validates the dict at
start-up so a bad value fails with a message naming the key, and
`setting_changed` clears the cache so tests can override it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULT_DATABASE = "default"
DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_HEARTBEAT_SECONDS = 10.0
DEFAULT_POLL_SECONDS = 1.0
DEFAULT_REAP_SECONDS = 5.0
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_SECONDS = 1.0
DEFAULT_BACKOFF_CAP_SECONDS = 600.0
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
DEFAULT_API_MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorSettings:
    DATABASE: str = DEFAULT_DATABASE  # Django alias holding conveyor_job.
    LEASE_SECONDS: float = DEFAULT_LEASE_SECONDS  # Lease granted by a claim or heartbeat.
    HEARTBEAT_SECONDS: float = DEFAULT_HEARTBEAT_SECONDS  # How often leases are renewed.
    POLL_SECONDS: float = DEFAULT_POLL_SECONDS  # Idle poll: the safety net under NOTIFY.
    REAP_SECONDS: float = DEFAULT_REAP_SECONDS  # How often a worker reaps expired leases.
    SHUTDOWN_TIMEOUT_SECONDS: float = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS  # Grace on SIGTERM.
    MAX_ATTEMPTS: int = DEFAULT_MAX_ATTEMPTS  # Attempts before a job is dead.
    BACKOFF_BASE_SECONDS: float = DEFAULT_BACKOFF_BASE_SECONDS  # First retry's ceiling.
    BACKOFF_CAP_SECONDS: float = DEFAULT_BACKOFF_CAP_SECONDS  # No retry waits longer.
    PREFETCH: int | None = None  # Jobs claimed ahead of free slots; None adapts.
    NOTIFY: bool = True  # Send NOTIFY inside the enqueue transaction.
    LISTEN: bool = True  # False: poll only (for poolers that break LISTEN).
    LISTENER_DSN: str | None = None  # Direct connection for LISTEN, bypassing a pooler.
    RETENTION_SECONDS: float = DEFAULT_RETENTION_SECONDS  # Finished jobs kept by pruning.
    # Sharding: queue name -> Django alias; other queues live in DATABASE.
    QUEUE_DATABASES: dict[str, str] = field(default_factory=dict)
    # Periodic jobs: schedule name -> {schedule, task, ...}; see docs/cron.md.
    CRON: dict[str, dict[str, Any]] = field(default_factory=dict)
    # HTTP API (docs/api.md): task paths or patterns the API may enqueue; none by default.
    API_TASKS: tuple[str, ...] = ()
    API_MAX_BODY_BYTES: int = DEFAULT_API_MAX_BODY_BYTES  # Larger POST bodies are refused.
    # Metrics (docs/metrics.md): addresses or networks that may scrape without a key.
    METRICS_ALLOWED_ADDRESSES: tuple[str, ...] = ()

    def database_for(self, queue: str) -> str:
        """The alias whose conveyor_job holds this queue's jobs."""
        return self.QUEUE_DATABASES.get(queue, self.DATABASE)

    def databases(self) -> list[str]:
        """Every alias that holds conveyor tables, DATABASE first."""
        return list(dict.fromkeys([self.DATABASE, *self.QUEUE_DATABASES.values()]))


_NUMBER = (int, float)
SETTING_TYPES: dict[str, tuple[type, ...]] = {
    "DATABASE": (str,),
    "LEASE_SECONDS": _NUMBER,
    "HEARTBEAT_SECONDS": _NUMBER,
    "POLL_SECONDS": _NUMBER,
    "REAP_SECONDS": _NUMBER,
    "SHUTDOWN_TIMEOUT_SECONDS": _NUMBER,
    "MAX_ATTEMPTS": (int,),
    "BACKOFF_BASE_SECONDS": _NUMBER,
    "BACKOFF_CAP_SECONDS": _NUMBER,
    "PREFETCH": (int, type(None)),
    "NOTIFY": (bool,),
    "LISTEN": (bool,),
    "LISTENER_DSN": (str, type(None)),
    "RETENTION_SECONDS": _NUMBER,
    "QUEUE_DATABASES": (dict,),
    "CRON": (dict,),
    "API_TASKS": (list, tuple),
    "API_MAX_BODY_BYTES": (int,),
    "METRICS_ALLOWED_ADDRESSES": (list, tuple),
}


def raw_settings() -> dict[str, Any]:
    """The user's CONVEYOR dict as written (validated by the checks)."""
    value = getattr(django_settings, "CONVEYOR", None)
    return dict(value) if isinstance(value, dict) else {}


@functools.cache
def conveyor_settings() -> ConveyorSettings:
    known = {f.name for f in fields(ConveyorSettings)}
    values = {k: v for k, v in raw_settings().items() if k in known}
    if "QUEUE_DATABASES" in values:
        values["QUEUE_DATABASES"] = dict(values["QUEUE_DATABASES"])
    for key in ("API_TASKS", "METRICS_ALLOWED_ADDRESSES"):
        if key in values:
            values[key] = tuple(values[key])
    for key in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "POLL_SECONDS", "REAP_SECONDS"):
        if key in values:
            values[key] = float(values[key])
    return ConveyorSettings(**values)


@receiver(setting_changed)
def _reset_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting in {"CONVEYOR", "DATABASES"}:
        conveyor_settings.cache_clear()
