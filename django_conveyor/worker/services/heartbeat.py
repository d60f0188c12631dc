"""The heartbeat: renew every lease the worker holds, in one statement.

A job missing from the statement's result has been taken from this worker
(reaped after its lease expired, so claimed by another token): its handler
is told (`context.lease_held()` turns false) and its outcome will not be
written. A job whose row is locked is skipped by the statement (SKIP
LOCKED) but not lost: its own handler's open `context.atomic()` holds the
lock (which keeps the reaper off), or another worker's claim looked at the
row and let it go. The statement is then followed by a plain read of the
missed rows, and those still carrying this worker's token are held.

The same pass is where the worker learns what else the database wants of
the jobs it holds: cancel requests (issue 14) arrive with the renewal and
become CANCEL_HELD outcomes through `Holdings.give_up`, counted in
`HeartbeatCounts`.
"""

from __future__ import annotations

from typing import NamedTuple

from ... import protocol
from ...conf import DEFAULT_HEARTBEAT_SECONDS
from ...protocol import Cursor
from ..attempts import CANCEL_HELD, Outcome
from ..holdings import Holdings
from .base import Now

DEFAULT_INTERVAL_SECONDS = DEFAULT_HEARTBEAT_SECONDS  # CONVEYOR["HEARTBEAT_SECONDS"]
LEASE_FRACTION = 1 / 3  # Never beat less often than this share of the lease.


class HeartbeatCounts(NamedTuple):
    renewed: int = 0  # Leases renewed by this pass.
    leases_lost: int = 0  # Leases the database says another party has now.
    cancels_honoured: int = 0  # Running jobs an operator asked to cancel, now CANCEL_HELD.


def interval_for(lease_seconds: float, heartbeat_seconds: float) -> float:
    """The setting, or a third of the lease if that is shorter: room to miss a beat."""
    return min(heartbeat_seconds, lease_seconds * LEASE_FRACTION)


class Heartbeat:
    name = "heartbeat"
    while_draining = True  # Handlers still running at shutdown keep their leases.

    def __init__(
        self,
        holdings: Holdings,
        *,
        lease_seconds: float,
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        self.holdings = holdings
        self.lease_seconds = lease_seconds
        self.interval = interval

    def run_once(self, cursor: Cursor, now: Now) -> HeartbeatCounts:
        held = self.holdings.renewable()
        if not held:
            return HeartbeatCounts()
        renewed = protocol.heartbeat(
            cursor, owner=self.holdings.owner, held=held, lease_seconds=self.lease_seconds
        )
        lost = 0
        for job_id, version in held:
            current = self.holdings.held.get(job_id)
            if current is None or current.lease.version != version or job_id in renewed:
                continue  # Renewed, or its outcome was written meanwhile.
            if job_id in renewed.locked:
                continue  # Another transaction has the row locked; the token still holds.
            if current.in_atomic or current.completed_in_atomic:
                continue  # Its own guarded block holds the row: not lost.
            self.holdings.lose(current, "heartbeat found the lease gone")
            lost += 1
        cancelled = sum(self.honour_cancel(job_id) for job_id in renewed.cancel_requested)
        return HeartbeatCounts(renewed=len(renewed), leases_lost=lost, cancels_honoured=cancelled)

    def honour_cancel(self, job_id: int) -> bool:
        """Stop the handler of a job an operator cancelled; CANCEL_HELD is written next cycle.

        The lease stops being held at once: `context.lease_held()` turns false,
        an async handler's task is cancelled, and whatever the handler returns
        later is stale. A job inside its guarded block is not renewed (its row
        is locked), so it never gets here: its commit decides.
        """
        attempt = self.holdings.held.get(job_id)
        if attempt is None or attempt.in_atomic or attempt.completed_in_atomic:
            return False
        attempt.cancel_requested = True
        return self.holdings.give_up(
            attempt, Outcome(CANCEL_HELD, attempt), "cancelled at an operator's request"
        )
