"""django-conveyor: a durable job queue for Django on PostgreSQL alone.

The folders are the roles: the protocol's SQL in protocol.py, the worker
runtime in worker/ (its control loop in worker/loop.py, its services in
worker/services/), periodic jobs in periodic/, workflows and their gates in
workflows/, the admin, the HTTP API and the metrics in admin/, api/ and
metrics/, the settings in conf.py. docs/architecture.md maps them all and
follows a job through them.
"""

from typing import Any

from .exceptions import ConveyorError, Discard, LeaseLost, Snooze

__all__ = [
    "ConveyorError",
    "Discard",
    "LeaseLost",
    "Snooze",
    "Unique",
    "reject_signal",
    "send_signal",
    "task",
]


def __getattr__(name: str) -> Any:
    # `task` and `Unique` import django.tasks, which needs settings; load them on first use.
    if name == "task":
        from .tasks import task

        return task
    if name == "Unique":
        from .unique import Unique

        return Unique
    if name in ("send_signal", "reject_signal"):
        from .workflows import gates

        return getattr(gates, name)
    raise AttributeError(name)
