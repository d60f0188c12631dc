"""The leases one worker holds and the outcomes it has yet to write.

`Leases` is their one owner. Jobs enter by a claim (`take`) and leave by a
written outcome (`settle`); in between, at most one outcome per lease waits
in `pending`. Outcomes arrive two ways: a handler's, reported from its slot
thread (`report`, then `collect` on the control loop), and the loop's own
decisions, a timeout or a hand-back (`give_up`). Either way they are
written by the same cycle through `outcomes.write`.

A handler's outcome whose lease is no longer held (lost at a heartbeat,
timed out, handed back) is stale: it is logged, counted and never written.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..conf import DEFAULT_LEASE_SECONDS
from ..protocol import Cursor, Lease
from . import outcomes
from .logs import log_job
from .outcomes import Outcome

if TYPE_CHECKING:
    from ..results import ConveyorTaskResult
    from .instrument import Instrument, Stats

logger = logging.getLogger("django_conveyor.worker")


@dataclass(slots=True, eq=False)
class HeldLease:
    """One lease this worker holds, shared by the control loop and the handler's slot."""

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


class Leases:
    def __init__(
        self,
        owner: str,
        database: str,
        stats: Stats,
        instrument: Instrument | None = None,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self.owner = owner  # The worker id: lease_owner of every lease held here.
        self.database = database
        self.lease_seconds = lease_seconds  # Of a claim or heartbeat: bounds context.atomic().
        self.stats = stats
        self.instrument = instrument  # None: nothing listens, and nothing is called.
        self.held: dict[int, HeldLease] = {}
        self.pending: dict[int, Outcome] = {}  # Job id -> its outcome, not yet committed.
        self.reported: queue.SimpleQueue[Outcome] = queue.SimpleQueue()  # From slot threads.
        self.finished_attempts = 0

    def take(self, claimed: list[Lease]) -> list[HeldLease]:
        """Hold the leases a claim returned."""
        taken = [HeldLease(lease, self.database, self.lease_seconds) for lease in claimed]
        for held in taken:
            self.held[held.lease.id] = held
        if claimed:
            self.stats.add("claimed", len(claimed))
            if self.instrument:
                self.instrument.claimed(claimed)
        return taken

    def report(self, outcome: Outcome) -> None:
        """A handler's attempt ended (called from its slot thread)."""
        self.reported.put(outcome)

    def collect(self) -> None:
        """Move reported outcomes into `pending`, dropping those whose lease is gone."""
        while True:
            try:
                outcome = self.reported.get_nowait()
            except queue.Empty:
                return
            self.finished_attempts += 1
            job_id = outcome.held.lease.id
            # The guarded commit already proved the token held: never stale.
            if self.held.get(job_id) is not outcome.held and (
                outcome.kind != outcomes.DONE_IN_ATOMIC
            ):
                self.refused(outcome, "stale outcome (%s) not written")
                continue
            self.pending[job_id] = outcome

    def give_up(self, held: HeldLease, outcome: Outcome, reason: str) -> bool:
        """The loop decides this attempt's outcome itself (timeout, hand-back).

        The lease stops being held at once, so the handler's own outcome, if
        it ever comes, is stale. False when the attempt already has an outcome.
        """
        if held.lease.id in self.pending or self.held.get(held.lease.id) is not held:
            return False
        del self.held[held.lease.id]
        held.mark_lost(reason)
        self.pending[held.lease.id] = outcome
        return True

    def lose(self, held: HeldLease, reason: str) -> None:
        """The database says another party has the job: forget it, write nothing."""
        if self.held.get(held.lease.id) is held:
            del self.held[held.lease.id]
        held.mark_lost(reason)  # Counted by the caller (HeartbeatCounts.leases_lost).
        if self.instrument:
            self.instrument.lease_lost(held.lease, reason)
        log_job(logger, logging.WARNING, held.lease, "lease lost: its outcome will not be written")

    def renewable(self) -> list[tuple[int, int]]:
        """(job id, version) of every lease a heartbeat should renew.

        A job its guarded commit completed is done: nothing to renew.
        """
        return [
            (h.lease.id, h.lease.version) for h in self.held.values() if not h.completed_in_atomic
        ]

    def holds_isolated(self) -> bool:
        """A lease from CLAIM_ISOLATED is held: nothing may be claimed ahead beside it."""
        return any(h.lease.isolated for h in self.held.values())

    def statements(self) -> int:
        """How many statements writing `pending` takes (one per kind)."""
        return len({o.kind for o in self.pending.values()})

    def write(self, cur: Cursor) -> dict[int, str]:
        """Write every pending outcome, fenced; call `settle` once the cycle commits."""
        if not self.pending:
            return {}
        return outcomes.write(cur, self.owner, outcomes.by_kind(self.pending.values()))

    def write_each(self, cur: Cursor, savepoint: outcomes.Savepoint) -> dict[int, str]:
        """After PostgreSQL refused the batch: every pending outcome alone (outcomes.write_each).

        A refused outcome is replaced in `pending` by the FAIL written in its
        place, so `settle` counts and reports what was really written.
        """
        each = outcomes.write_each(cur, self.owner, list(self.pending.values()), savepoint)
        self.pending.update(each.replaced)
        for job_id in each.abandoned:  # Left to its lease: no longer held, nothing pending.
            if self.held.get(job_id) is self.pending[job_id].held:
                del self.held[job_id]
            del self.pending[job_id]
        self.stats.add("outcomes_refused", len(each.replaced) + len(each.abandoned))
        return each.written

    def settle(self, written: dict[int, str]) -> list[Outcome]:
        """After the commit: forget the written leases, count, report what was refused.

        Outcomes stay pending until the commit succeeds, so a connection lost
        mid-cycle only means the same guarded writes are sent again. Returns
        the outcomes that were written, for `task_finished` (reporting.py).
        """
        done = []
        for job_id, outcome in self.pending.items():
            if self.held.get(job_id) is outcome.held:
                del self.held[job_id]
            result = written.get(job_id)
            if result is None:
                self.refused(outcome, "stale outcome (%s) refused")
            else:
                done.append(outcome)
                self.stats.add(result)
                if self.instrument:
                    self.instrument.outcome_written(
                        outcome.kind, result, outcome.lease, outcome.held.duration
                    )
        self.pending.clear()
        return done

    def refused(self, outcome: Outcome, message: str) -> None:
        self.stats.add("stale_outcomes")
        if self.instrument:
            self.instrument.outcome_refused(outcome.kind, outcome.lease)
        log_job(logger, logging.WARNING, outcome.lease, message, outcome.kind)

    def idle(self) -> bool:
        """Nothing held and nothing left to write."""
        return not self.held and not self.pending and self.reported.empty()
