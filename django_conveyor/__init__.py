"""django-conveyor: a durable job queue for Django on PostgreSQL alone."""

from typing import Any

from .exceptions import ConveyorError, Discard, LeaseLost, Snooze

__all__ = ["ConveyorError", "Discard", "LeaseLost", "Snooze", "task"]


def __getattr__(name: str) -> Any:
    # `task` imports django.tasks, which needs settings; load it on first use.
    if name == "task":
        from .tasks import task

        return task
    raise AttributeError(name)
