"""Writing a batch of finished attempts: one fenced statement per kind.

Each row is matched on its own owner and version, so a batch can mix fresh
and stale outcomes; the returned mapping says which rows were written and
what became of them, and anything missing from it was refused by the fence.
"""

from __future__ import annotations

from . import executor, protocol
from .executor import Outcome
from .protocol import Cursor


def write_batch(cur: Cursor, owner: str, kind: str, outcomes: list[Outcome]) -> dict[int, str]:
    """One fenced statement for a batch of one kind; returns id -> what happened."""
    if kind == executor.COMPLETE:
        done = [(o.lease.id, o.lease.version, o.return_value) for o in outcomes]
        return dict.fromkeys(protocol.complete(cur, owner=owner, done=done), "completed")
    if kind == executor.RETRY:
        failures = [(o.lease.id, o.lease.version, o.delay, o.error) for o in outcomes]
        states = protocol.retry(cur, owner=owner, failures=failures)
        return {i: "retried" if state == "available" else state for i, state in states.items()}
    if kind == executor.FAIL:
        failures = [(o.lease.id, o.lease.version, o.error) for o in outcomes]
        return dict.fromkeys(protocol.fail(cur, owner=owner, failures=failures), "failed")
    if kind == executor.SNOOZE:
        snoozed = [(o.lease.id, o.lease.version, o.delay) for o in outcomes]
        return dict.fromkeys(protocol.snooze(cur, owner=owner, snoozed=snoozed), "snoozed")
    if kind == executor.DONE_IN_ATOMIC:
        # context.atomic() already completed these; store what they returned.
        done = [(o.lease.id, o.lease.version, o.return_value) for o in outcomes]
        protocol.record_result(cur, owner=owner, done=done)
        return {o.lease.id: "completed" for o in outcomes}
    # LOST: the guarded transaction refused the handler; nothing to write.
    return {}
