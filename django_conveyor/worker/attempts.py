"""One attempt at a job, as the control loop and its handler share it, and how it ends.

An `Attempt` starts when a claim returns a job's `Lease` (the row and its
fencing token) and is shared by the control loop and the slot that runs
the handler: each tells the other what it must know (the lease is lost,
an operator asked to cancel, the handler is inside `context.atomic()` or
completed there). A handler's `JobContext` (context.py) is its view of it.

An `Outcome` is what the attempt asks the database to do when it ends: a
kind, the attempt it is about, and what the write needs. Handlers' results
(the executor), timeouts (services/timeouts.py) and hand-backs at shutdown
(`Worker.hand_back`) all become outcomes, which the control loop writes in
its next cycle (outcomes.py, through `Holdings`).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..bounds import MAX_SECONDS
from ..conf import DEFAULT_LEASE_SECONDS
from ..protocol import Lease
from ..serialization import storable_text
from .backoff import capped_delay
from .instrument import log_job

if TYPE_CHECKING:
    from ..results import ConveyorTaskResult

COMPLETE = "complete"
RETRY = "retry"
FAIL = "fail"
SNOOZE = "snooze"
RELEASE = "release"  # Handed back unfinished (shutdown): the attempt does not count.
DONE_IN_ATOMIC = "done_in_atomic"  # context.atomic() already wrote the completion.
LOST = "lost"  # The handler met LeaseLost: nothing to write.
CANCEL_HELD = "cancel_held"  # An operator asked to cancel the running job: honour it.

logger = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Attempt:
    """One attempt at a claimed job, shared by the control loop and the handler's slot."""

    lease: Lease  # The row as claimed; lease.owner and lease.version are the token.
    database: str  # The alias whose conveyor_job holds the job.
    # Bounds each statement, and each idle gap, of context.atomic() (seconds).
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    # Set by the loop, read by the handler's thread: a plain flag is enough (and cheap).
    lost: bool = False
    lost_reason: str = ""
    in_atomic: bool = False  # Holding the row lock in context.atomic() right now.
    completed_in_atomic: bool = False  # The guarded commit wrote the completion.
    timeout: float | None = None  # The task's timeout, known once a slot starts it.
    started_at: float | None = None  # time.monotonic(); None while buffered.
    finished_at: float | None = None
    cancel_requested: bool = False  # An operator asked to cancel it (context.cancel_requested).
    # Set by the executor while an async handler runs: cancels its asyncio task.
    cancel_async: Callable[[], None] | None = None
    # The result task_started carried (set by the executor); task_finished builds on it.
    result: ConveyorTaskResult | None = None
    # Atomic blocks open around the handler on its connection: a test's, when
    # django_conveyor.testing runs it; 0 in a worker. context.atomic() nests in them.
    outer_atomic_blocks: int = 0

    def mark_lost(self, reason: str) -> None:
        """Tell the handler (context.lease_held()) that its outcome will not count."""
        self.lost_reason = reason
        self.lost = True
        if self.cancel_async is not None:
            self.cancel_async()  # An async handler stops at its next await.

    @property
    def duration(self) -> float | None:
        """Seconds the handler ran, once it has returned."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


@dataclass(slots=True)
class Outcome:
    """What an attempt asks the database to do when it ends (written by outcomes.py)."""

    kind: str
    attempt: Attempt
    return_value: Any = None
    delay: float = 0.0  # Seconds before the job is due again (RETRY, SNOOZE).
    error: dict[str, Any] = field(default_factory=dict)  # The attempt's error entry.
    note: str | None = None  # What the worker changed (a capped delay), recorded with it.
    exception: BaseException | None = None  # What the handler raised, for task_finished.

    @property
    def lease(self) -> Lease:
        """The token the write is guarded by."""
        return self.attempt.lease


def error_entry(exc: BaseException, note: str = "") -> dict[str, Any]:
    """The attempt's entry in the job's `errors` (the statement adds attempt, worker, time).

    Its text is made storable (NUL characters escaped, with a note saying so);
    `note` is appended to the traceback.
    """
    cls = type(exc)
    text = "".join(traceback.format_exception(exc)) + (f"\n{note}\n" if note else "")
    return {
        "exception_class_path": storable_text(f"{cls.__module__}.{cls.__qualname__}"),
        "traceback": storable_text(text),
    }


def _capped_note(asked: float) -> str:
    return (
        f"The delay asked for, {asked:g} seconds, is longer than the maximum of "
        f"{MAX_SECONDS:.0f} seconds (ten years): the job waits the maximum instead."
    )


def retry(attempt: Attempt, delay: float, error: dict[str, Any]) -> Outcome:
    """A RETRY after `delay` seconds; a delay past the maximum is capped and noted in `error`."""
    asked = delay
    delay, capped = capped_delay(delay)
    if capped:
        error = {**error, "traceback": f"{error.get('traceback', '')}\n{_capped_note(asked)}"}
        log_job(logger, logging.WARNING, attempt.lease, "retry delay capped at %.0fs", delay)
    return Outcome(RETRY, attempt, delay=delay, error=error)


def snooze(attempt: Attempt, seconds: float) -> Outcome:
    """A SNOOZE for `seconds` (finite, zero or more); past the maximum it is capped, in history."""
    delay, capped = capped_delay(seconds)
    if not capped:
        return Outcome(SNOOZE, attempt, delay=delay)
    log_job(logger, logging.WARNING, attempt.lease, "snooze of %gs capped at %.0fs", seconds, delay)
    return Outcome(SNOOZE, attempt, delay=delay, note=_capped_note(seconds))
