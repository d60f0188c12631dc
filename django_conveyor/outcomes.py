"""What an attempt asks the database to do when it ends, and how that is written.

An `Outcome` is a kind plus the held lease it is about. Every write a
worker makes about a job it holds goes through here: handlers' results
(the executor), timeouts (timeouts.py) and hand-backs at shutdown
(shutdown.py) all become outcomes, which the control loop writes in its
next cycle with one fenced statement per kind (`write`).

Each row is matched on its own owner and version, so a batch can mix fresh
and stale outcomes; a writer returns what became of the rows it wrote, and
a row missing from that was refused by the fence.

To add a kind: a constant, a writer calling its protocol statement, and an
entry in `WRITERS`.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import protocol
from .protocol import Cursor, Lease

if TYPE_CHECKING:
    from .leases import HeldLease

COMPLETE = "complete"
RETRY = "retry"
FAIL = "fail"
SNOOZE = "snooze"
RELEASE = "release"  # Handed back unfinished (shutdown): the attempt does not count.
DONE_IN_ATOMIC = "done_in_atomic"  # context.atomic() already wrote the completion.
LOST = "lost"  # The handler met LeaseLost: nothing to write.
CANCEL_HELD = "cancel_held"  # An operator asked to cancel the running job: honour it.


@dataclass(slots=True)
class Outcome:
    kind: str
    held: HeldLease
    return_value: Any = None
    delay: float = 0.0  # Seconds before the job is due again (RETRY, SNOOZE).
    error: dict[str, Any] = field(default_factory=dict)  # The attempt's error entry.
    exception: BaseException | None = None  # What the handler raised, for task_finished.

    @property
    def lease(self) -> Lease:
        """The token the write is guarded by."""
        return self.held.lease


def error_entry(exc: BaseException) -> dict[str, Any]:
    """The attempt's entry in the job's `errors` (the statement adds attempt, worker, time)."""
    cls = type(exc)
    return {
        "exception_class_path": f"{cls.__module__}.{cls.__qualname__}",
        "traceback": "".join(traceback.format_exception(exc)),
    }


# A writer: one fenced statement for a batch of one kind -> {job id: what it became}.
Writer = Callable[[Cursor, str, list[Outcome]], dict[int, str]]


def _complete(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    done = [(o.held.lease.id, o.held.lease.version, o.return_value) for o in batch]
    return dict.fromkeys(protocol.complete(cur, owner=owner, done=done), "completed")


def _retry(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    failures = [(o.lease.id, o.lease.version, o.delay, o.error) for o in batch]
    states = protocol.retry(cur, owner=owner, failures=failures)
    return {i: "retried" if state == "available" else state for i, state in states.items()}


def _fail(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    failures = [(o.lease.id, o.lease.version, o.error) for o in batch]
    return dict.fromkeys(protocol.fail(cur, owner=owner, failures=failures), "failed")


def _snooze(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    snoozed = [(o.lease.id, o.lease.version, o.delay) for o in batch]
    return dict.fromkeys(protocol.snooze(cur, owner=owner, snoozed=snoozed), "snoozed")


def _release(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    held = [(o.lease.id, o.lease.version) for o in batch]
    return dict.fromkeys(protocol.release(cur, owner=owner, held=held), "released")


def _record_result(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    # context.atomic() already completed these; store what they returned.
    done = [(o.lease.id, o.lease.version, o.return_value) for o in batch]
    protocol.record_result(cur, owner=owner, done=done)
    return {o.lease.id: "completed" for o in batch}


def _cancel_held(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    held = [(o.lease.id, o.lease.version) for o in batch]
    cancelled = protocol.cancel_held(cur, owner=owner, held=held, actor=f"worker:{owner}")
    return dict.fromkeys(cancelled, "cancelled")


def _nothing(cur: Cursor, owner: str, batch: list[Outcome]) -> dict[int, str]:
    return {}


WRITERS: dict[str, Writer] = {
    COMPLETE: _complete,
    RETRY: _retry,
    FAIL: _fail,
    SNOOZE: _snooze,
    RELEASE: _release,
    DONE_IN_ATOMIC: _record_result,
    LOST: _nothing,
    CANCEL_HELD: _cancel_held,
}


def by_kind(outcomes: Iterable[Outcome]) -> dict[str, list[Outcome]]:
    batches: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        batches.setdefault(outcome.kind, []).append(outcome)
    return batches


def write(cur: Cursor, owner: str, batches: dict[str, list[Outcome]]) -> dict[int, str]:
    """Write every batch, one statement per kind; returns {job id: what it became}."""
    written: dict[int, str] = {}
    for kind, batch in batches.items():
        written.update(WRITERS[kind](cur, owner, batch))
    return written
