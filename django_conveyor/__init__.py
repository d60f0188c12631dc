"""django-conveyor: a durable job queue for Django on PostgreSQL alone.

Each behaviour is a module named after it: the protocol's SQL in protocol.py,
the worker's control loop in worker.py and its services beside it
(heartbeat.py, reaper.py, timeouts.py), signals and shutdown in shutdown.py,
every growing delay in backoff.py, the settings in conf.py. docs/architecture.md
maps them all and follows a job through them.
"""

from typing import Any

from .exceptions import ConveyorError, Discard, LeaseLost, Snooze

__all__ = [
    "ConveyorError",
    "Discard",
    "LeaseLost",
    "Snooze",
    "reject_signal",
    "send_signal",
    "task",
]


def __getattr__(name: str) -> Any:
    # `task` imports django.tasks, which needs settings; load it on first use.
    if name == "task":
        from .tasks import task

        return task
    if name in ("send_signal", "reject_signal"):
        from . import gates

        return getattr(gates, name)
    raise AttributeError(name)
