"""Signals of django-conveyor, beside the standard ones of `django.tasks`.

`task_enqueued` (django.tasks) is sent for every new job. An enqueue whose
idempotency key already names a job writes nothing and sends
`task_enqueue_replayed` instead, with the existing job's result, so that
metrics can count replays apart from new jobs.

`heard()` says whether sending one of django.tasks' signals could have any
effect, so the worker can skip building a result nobody would see.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from .compat import tasks_logger

task_enqueue_replayed = Signal()  # sender: the backend class; task_result: the existing job.


def heard(signal: Signal, log_receiver: Callable[..., Any], level: int) -> bool:
    """False only when the one receiver is django.tasks' own log line, and it is off.

    django.tasks connects a receiver that logs each signal on the
    `django.tasks` logger; when that is all that listens and the logger would
    drop the line, nothing observes the signal. Any other receiver (of any
    sender, dead or alive) means the signal is sent.
    """
    receivers = list(signal.receivers)  # A copy: another thread may connect meanwhile.
    if len(receivers) != 1:
        return bool(receivers)
    receiver = receivers[0][1]  # (lookup key, receiver or a weak reference to it, ...)
    if isinstance(receiver, weakref.ReferenceType):
        receiver = receiver()
    return receiver is not log_receiver or tasks_logger.isEnabledFor(level)
