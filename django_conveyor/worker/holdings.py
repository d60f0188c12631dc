"""What one worker holds: its attempts, and the outcomes it has yet to write.

`Holdings` is their one owner. Jobs enter by a claim (`take`, which makes
each claimed `Lease` an `Attempt`) and leave by a written outcome
(`settle`); in between, at most one outcome per attempt waits in
`pending`, until a cycle takes it (`take_pending`) to write; from then it is
in flight until that cycle settles it, or hands it back (`restore`) if the
cycle failed. Outcomes arrive two ways: a handler's, reported from its slot
thread (`report`, then `collect` on the control loop), and the loop's own
decisions, a timeout or a hand-back (`give_up`). Either way they are
written by a cycle through `outcomes.write`.

Every method runs on the control loop's thread, but `report` (slots) and
the writes (`write`, `write_each`, which a cycle may run on a thread of its
own: they only read the batch they are given).

A handler's outcome whose lease is no longer held (lost at a heartbeat,
timed out, handed back) is stale: it is logged, counted and never written.
"""

from __future__ import annotations

import logging
import queue
from collections import Counter
from typing import TYPE_CHECKING

from .. import readable
from ..conf import DEFAULT_LEASE_SECONDS
from ..protocol import Cursor, Lease
from . import outcomes
from .attempts import (
    CANCEL_HELD,
    COMPLETE,
    DONE_IN_ATOMIC,
    Attempt,
    Outcome,
    log_written,
    unreadable,
)
from .instrument import log_job

if TYPE_CHECKING:
    from .instrument import Counters, Instrument

logger = logging.getLogger(__name__)


class Holdings:
    def __init__(
        self,
        owner: str,
        database: str,
        counters: Counters,
        instrument: Instrument | None = None,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> None:
        self.owner = owner  # The worker id: lease_owner of every lease held here.
        self.database = database
        self.lease_seconds = lease_seconds  # Of a claim or heartbeat: bounds context.atomic().
        self.counters = counters
        self.instrument = instrument  # None: nothing listens, and nothing is called.
        self.held: dict[int, Attempt] = {}  # Job id -> its attempt, until its outcome is written.
        self.pending: dict[int, Outcome] = {}  # Job id -> its outcome, not yet sent.
        self.in_flight: dict[int, Outcome] = {}  # Job id -> its outcome, sent by a cycle.
        # Ids of the isolated leases taken (a few at most): read every cycle,
        # so `holds_isolated` never walks a deep claim-ahead buffer.
        self.isolated_taken: set[int] = set()
        self.reported: queue.SimpleQueue[Outcome] = queue.SimpleQueue()  # From slot threads.
        self.finished_attempts = 0
        self.unreadable_seen = readable.seen()  # Unreadable values met before this worker.

    def take(self, claimed: list[Lease]) -> list[Attempt]:
        """Hold the leases a claim returned, each as an attempt; returns those to run.

        A lease whose row holds a value Python could not load (readable.py)
        does not run: its FAIL is pending at once, for the next cycle. Looked
        for only when the fetch met such a value, so a claim pays nothing.
        """
        taken = [Attempt(lease, self.database, self.lease_seconds) for lease in claimed]
        for attempt in taken:
            self.held[attempt.lease.id] = attempt
            if attempt.lease.isolated:
                self.isolated_taken.add(attempt.lease.id)
        if claimed:
            self.counters.add("claimed", len(claimed))
            if self.instrument:
                self.instrument.claimed(claimed)
        if readable.seen() != self.unreadable_seen:
            self.unreadable_seen = readable.seen()
            taken = [attempt for attempt in taken if not self.fail_unreadable(attempt)]
        return taken

    def fail_unreadable(self, attempt: Attempt) -> bool:
        """Make the job's FAIL pending if its row holds unreadable values."""
        values = readable.unreadable_values(attempt.lease)
        if not values:
            return False
        self.pending[attempt.lease.id] = unreadable(attempt, values)
        self.counters.add("unreadable_rows")
        return True

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
            job_id = outcome.lease.id
            # The guarded commit already proved the token held: never stale.
            if self.held.get(job_id) is not outcome.attempt and outcome.kind != DONE_IN_ATOMIC:
                self.refused(outcome, "stale outcome (%s) not written")
                continue
            self.pending[job_id] = outcome

    def give_up(self, attempt: Attempt, outcome: Outcome, reason: str) -> bool:
        """The loop decides this attempt's outcome itself (timeout, hand-back).

        The lease stops being held at once, so the handler's own outcome, if
        it ever comes, is stale. False when the attempt already has an outcome.
        """
        job_id = attempt.lease.id
        if (
            job_id in self.pending
            or job_id in self.in_flight
            or self.held.get(job_id) is not attempt
        ):
            return False
        del self.held[job_id]
        attempt.mark_lost(reason)
        self.pending[job_id] = outcome
        return True

    def lose(self, attempt: Attempt, reason: str) -> None:
        """The database says another party has the job: forget it, write nothing."""
        if self.held.get(attempt.lease.id) is attempt:
            del self.held[attempt.lease.id]
        attempt.mark_lost(reason)  # Counted by the caller (HeartbeatCounts.leases_lost).
        if self.instrument:
            self.instrument.lease_lost(attempt.lease, reason)
        log_job(
            logger, logging.WARNING, attempt.lease, "lease lost: its outcome will not be written"
        )

    def renewable(self) -> list[tuple[int, int]]:
        """(job id, version) of every lease a heartbeat should renew.

        A job its guarded commit completed is done: nothing to renew. Nor is
        one whose outcome is on its way: a cycle on another connection may be
        writing it right now (its row locked, then no longer running), which
        a heartbeat must not take for a lost lease; should that cycle fail,
        the outcome is pending again and the next beat renews the lease.
        """
        pending, in_flight = self.pending, self.in_flight
        return [
            (job_id, a.lease.version)
            for job_id, a in self.held.items()
            if not a.completed_in_atomic and job_id not in pending and job_id not in in_flight
        ]

    def unsettled(self) -> set[int]:
        """Ids of every job held or whose outcome waits to be written: all may have started."""
        return self.held.keys() | self.pending.keys() | self.in_flight.keys()

    def holds_isolated(self) -> bool:
        """A lease from CLAIM_ISOLATED is held: nothing may be claimed ahead beside it.

        One whose outcome is pending does not count: the cycle that plans the
        claim writes that outcome first, in the same transaction.
        """
        held, pending = self.held, self.pending
        self.isolated_taken = {
            i for i in self.isolated_taken if (a := held.get(i)) is not None and a.lease.isolated
        }
        return any(i not in pending for i in self.isolated_taken)

    def isolated_since(self) -> float | None:
        """When the held isolated job's handler started (time.monotonic()); None: not yet."""
        started = [
            a.started_at
            for i in self.isolated_taken
            if i not in self.pending and (a := self.held.get(i)) is not None
        ]
        return None if not started or None in started else min(started)  # type: ignore[type-var]

    def take_pending(self) -> dict[int, Outcome]:
        """The pending outcomes, for a cycle to write: in flight until `settle` or `restore`."""
        batch = self.pending
        self.pending = {}
        self.in_flight.update(batch)
        return batch

    def restore(self, batch: dict[int, Outcome]) -> None:
        """The cycle that took `batch` failed: pending again, to be written again (fenced)."""
        for job_id in batch:
            del self.in_flight[job_id]
        self.pending.update(batch)

    def write(self, cur: Cursor, batch: dict[int, Outcome]) -> dict[int, str]:
        """Write a batch of outcomes, fenced; `settle` it once the cycle commits."""
        if not batch:
            return {}
        return outcomes.write(cur, self.owner, outcomes.by_kind(batch.values()))

    def write_each(
        self, cur: Cursor, batch: dict[int, Outcome], savepoint: outcomes.Savepoint
    ) -> outcomes.EachWritten:
        """After PostgreSQL refused the batch: every outcome alone (outcomes.write_each).

        Changes nothing here (it may run on the cycle's own thread): the cycle
        applies what it did with `replace_refused` once it committed.
        """
        return outcomes.write_each(cur, self.owner, list(batch.values()), savepoint)

    def replace_refused(self, batch: dict[int, Outcome], each: outcomes.EachWritten) -> None:
        """A refused outcome is replaced in `batch` by the FAIL written in its place, so
        `settle` counts and reports what was really written; an abandoned one is left
        to its lease (no longer held, nothing to settle)."""
        batch.update(each.replaced)
        for job_id in each.abandoned:
            if self.held.get(job_id) is batch[job_id].attempt:
                del self.held[job_id]
            del batch[job_id]
            del self.in_flight[job_id]
        self.counters.add("outcomes_refused", len(each.replaced) + len(each.abandoned))

    def settle(self, batch: dict[int, Outcome], written: dict[int, str]) -> list[Outcome]:
        """After the commit: forget the written leases, count, report what was refused.

        Outcomes stay in flight until the commit succeeds, so a connection lost
        mid-cycle only means the same guarded writes are sent again. Returns
        the outcomes that were written, for `task_finished` (reporting.py).
        """
        done = []
        held, in_flight = self.held, self.in_flight
        became: Counter[str] = Counter()
        for job_id, outcome in batch.items():
            del in_flight[job_id]
            if held.get(job_id) is outcome.attempt:
                del held[job_id]
            result = written.get(job_id)
            if result == "cancelled" and outcome.kind == COMPLETE:
                # Its COMPLETE was refused for a cancel request: CANCEL_HELD was written.
                log_job(logger, logging.INFO, outcome.lease, "cancelled as asked (its handler "
                        "returned before the request reached it)")  # fmt: skip
                outcome = Outcome(CANCEL_HELD, outcome.attempt)
            if result is None:
                self.refused(outcome, "stale outcome (%s) refused")
                continue
            outcome.became = result
            became[result] += 1
            if outcome.kind != COMPLETE:
                log_written(outcome)
            done.append(outcome)
            if self.instrument:
                self.instrument.outcome_written(
                    outcome.kind, result, outcome.lease, outcome.attempt.duration
                )
        self.counters.update(became)
        return done

    def refused(self, outcome: Outcome, message: str) -> None:
        self.counters.add("stale_outcomes")
        if self.instrument:
            self.instrument.outcome_refused(outcome.kind, outcome.lease)
        log_job(logger, logging.WARNING, outcome.lease, message, outcome.kind)

    def idle(self) -> bool:
        """Nothing held and nothing left to write."""
        return not self.held and not self.pending and not self.in_flight and self.reported.empty()
