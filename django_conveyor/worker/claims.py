"""What a worker claims in each cycle: how many jobs, and with which statements.

The claim fills the free slots plus a claim-ahead buffer, so that a slot
that frees up does not wait for a claim's round trip. Unless it is fixed
(`CONVEYOR["PREFETCH"]` or `--prefetch`), the buffer holds about
CLAIM_AHEAD_SECONDS of work per slot: deep when jobs are short, about
nothing when they are long, so a worker does not hoard slow jobs that an
idle peer could run.

`Claimer.plan` says which claim statements the cycle runs and with what
limit; the cycle runs them in its transaction, after the outcomes, in
order. CLAIM skips paused queues, jobs not yet due and isolated jobs in
its SQL (protocol.CLAIM).

Isolated jobs (a REAP returned them: they may have killed their worker)
are taken by CLAIM_ISOLATED, one at a time, only by a worker with a free
slot, no other isolated job and nothing claimed but not started, so that
no job claimed ahead dies with it; while it runs, the worker claims only
for its free slots. To keep the hot path one statement, the worker looks
for one right after a CLAIM that found nothing (idle, or drained), and
under steady load at least every ISOLATED_LOOK_SECONDS, first letting its
claim-ahead buffer run empty (about CLAIM_AHEAD_SECONDS of work).

Queues with limits (docs/flow-control.md) are claimed apart: CLAIM leaves
them out in its SQL, and each step then locks them (LOCK_LIMITED) and runs
CLAIM_LIMITED for each, in the cycle's transaction. A job of a limited
queue counts against its limit from its claim, so a job claimed ahead of a
slot holds capacity another worker could use: the statement claims ahead
only while the limit is far, and never under a rate (a claim is a start).
Which queues are limited is a route the limits service refreshes (`route`);
the guard is the SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .. import protocol
from ..protocol import Cursor, Lease

# Buffered work per slot. A deep buffer costs a crash nothing (starts.py); at
# 20 ms the default drained no-op jobs slower than a fixed 1,000 (docs/performance.md).
CLAIM_AHEAD_SECONDS = 0.1
MAX_PREFETCH = 1024  # Claimed ahead, at most (starts.py: most of it is never listed).
MAX_START_WINDOW = 1024  # Listed as may-start and queued for the slots, at most.
ISOLATED_LOOK_SECONDS = 1.0  # Under load, look for an isolated job at least this often.
# While jobs are short, an isolated job runs with nothing claimed beside it for
# this long: most end first, so the next one is claimed in the very next cycle.
ALONE_SECONDS = 0.01
SHORT_SECONDS = 0.001  # Jobs shorter than this on average are short.


@dataclass(frozen=True, slots=True)
class ClaimStep:
    statement: Callable[..., list[Lease]]  # A protocol claim: (cursor, owner, queues, ...).
    limit: int
    if_none_claimed: bool = False  # Run only if the steps before it claimed nothing.
    limit_alone: int | None = None  # The limit once an isolated job was claimed before it.
    free: int = 0  # Free slots: what a limited claim fills before it claims ahead.

    @property
    def isolated(self) -> bool:
        return self.statement is protocol.claim_isolated


class Claimer:
    def __init__(
        self,
        *,
        owner: str,
        queues: Sequence[str],
        concurrency: int,
        lease_seconds: float,
        prefetch: int | None,
    ) -> None:
        self.owner = owner
        self.queues = tuple(queues)
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.fixed_prefetch = prefetch  # None adapts to job length.
        self.isolated_due = 0.0  # time.monotonic() when a busy worker looks next.
        self.limited: tuple[str, ...] = ()  # Queues claimed by CLAIM_LIMITED (a route).
        self.ahead: tuple[str, ...] = ()  # Those of them that may be claimed ahead.
        self.free_queues = self.queues  # Queues claimed by CLAIM.
        # Other queues' ready rows sort ahead of the free queues' (the claim order
        # service looks): CLAIM_MERGED for them, which does not walk those rows.
        self.behind = False

    def route(self, limited: frozenset[str], rated: frozenset[str] = frozenset()) -> None:
        """Which of the worker's queues have limits, and which of those a rate (claimed
        for free slots only), as the limits service last read."""
        self.limited = tuple(q for q in self.queues if q in limited)
        self.ahead = tuple(q for q in self.limited if q not in rated)
        self.free_queues = tuple(q for q in self.queues if q not in limited)

    @property
    def may_merge(self) -> bool:
        """Whether CLAIM_MERGED can pay for the free queues: more than one, and few."""
        return 1 < len(self.free_queues) <= protocol.MERGED_CLAIM_QUEUES

    @property
    def merged(self) -> bool:
        """Whether CLAIM goes as CLAIM_MERGED (two statements: JIT off, then the claim)."""
        return self.behind and self.may_merge

    def statements(self, steps: list[ClaimStep]) -> int:
        """Statements the steps may run; above one, the cycle runs in a transaction.

        A limited claim is always two statements at least (the lock, then the
        claim), so it always runs in a transaction: the lock must last until
        the claim commits.
        """
        plain = (2 if self.merged else 1) if self.free_queues else 0
        limited = 1 + len(self.limited) if self.limited else 0
        return sum((0 if s.if_none_claimed else plain) + limited for s in steps)

    def prefetch(self, avg_duration: float | None) -> int:
        """How many claimed jobs may wait for a slot."""
        if self.fixed_prefetch is not None:
            return self.fixed_prefetch
        if avg_duration is None:
            return self.concurrency  # Nothing has run yet.
        per_slot = CLAIM_AHEAD_SECONDS / max(avg_duration, 1e-6)
        return min(MAX_PREFETCH, int(self.concurrency * per_slot))

    def start_window(self, avg_duration: float | None) -> int:
        """How many jobs may wait in the slots' queue, listed as may-start (starts.py):
        the part of the buffer a crash can implicate."""
        if self.fixed_prefetch is not None:
            return min(self.fixed_prefetch, MAX_START_WINDOW)
        return min(self.prefetch(avg_duration), MAX_START_WINDOW)

    def room(self, *, running: int, waiting: int, avg_duration: float | None) -> int:
        """Jobs to claim now: the free slots and the buffer, minus jobs already waiting."""
        free = max(0, self.concurrency - running)
        return free + self.prefetch(avg_duration) - waiting

    def plan(
        self,
        *,
        running: int,
        waiting: int,
        avg_duration: float | None,
        holds_isolated: bool = False,
        now: float = 0.0,
        isolated_since: float | None = None,
    ) -> list[ClaimStep]:
        """The claim steps of a cycle. `isolated_since`: when the isolated job held
        started (time.monotonic()), None if it has not (yet, or none is held)."""
        free = max(0, self.concurrency - running)
        look = now >= self.isolated_due
        short = avg_duration is not None and avg_duration < SHORT_SECONDS
        if holds_isolated and short and now - (isolated_since or now) < ALONE_SECONDS:
            # Short jobs: let a young isolated job end alone, then look for the next one
            # at once, rather than run isolated jobs one per round of free slots.
            return []
        if holds_isolated or (look and (free == 0 or waiting)):
            # Nothing claimed ahead beside an isolated job (or about to look for one).
            alone = free - waiting
            return [ClaimStep(protocol.claim, alone, free=alone)] if alone > 0 else []
        room = self.room(running=running, waiting=waiting, avg_duration=avg_duration)
        if free == 0 or waiting:
            return [ClaimStep(protocol.claim, room, free=free - waiting)] if room > 0 else []
        # A free slot and an empty buffer: an isolated job may be claimed (room >= free > 0).
        if not look:  # The hot path: one CLAIM, and CLAIM_ISOLATED only if it found nothing.
            return [
                ClaimStep(protocol.claim, room, free=free),
                ClaimStep(protocol.claim_isolated, 1, if_none_claimed=True, free=1),
            ]
        return [
            ClaimStep(protocol.claim_isolated, 1, free=1),
            ClaimStep(protocol.claim, room, limit_alone=0 if short else free - 1, free=free),
        ]

    def claim(self, cur: Cursor, steps: list[ClaimStep], now: float = 0.0) -> list[Lease]:
        claimed: list[Lease] = []
        alone = False  # An isolated job was claimed: nothing is claimed ahead of it.
        for step in steps:
            if step.if_none_claimed and claimed:
                continue
            limit = step.limit_alone if alone and step.limit_alone is not None else step.limit
            if limit <= 0:
                continue
            leases = self.run(cur, step, limit)
            if step.isolated:
                alone = bool(leases)
                # Found one: there may be more, look again once it is done.
                self.isolated_due = now if alone else now + ISOLATED_LOOK_SECONDS
            claimed += leases
        return claimed

    def send(self, cur: Cursor, step: ClaimStep, limit: int | None = None) -> None:
        """A plain CLAIM step of the free queues (of `limit` jobs, else the step's), its
        rows not read yet (a pipelined cycle reads them with `received`)."""
        protocol.send_claim(
            cur,
            owner=self.owner,
            queues=self.free_queues,
            limit=step.limit if limit is None else limit,
            lease_seconds=self.lease_seconds,
            merged=self.merged,
        )

    @staticmethod
    def received(cur: Cursor) -> list[Lease]:
        return protocol.claimed_leases(cur)

    def run(self, cur: Cursor, step: ClaimStep, limit: int) -> list[Lease]:
        """One step: CLAIM (or CLAIM_ISOLATED) for the free queues, then the limited ones."""
        leases: list[Lease] = []
        if self.free_queues and step.isolated:
            leases = protocol.claim_isolated(
                cur,
                owner=self.owner,
                queues=self.free_queues,
                limit=limit,
                lease_seconds=self.lease_seconds,
            )
        elif self.free_queues:
            self.send(cur, step, limit)
            leases = self.received(cur)
        if not self.limited:
            return leases
        # The free slots, and ahead of them while a limit is far (CLAIM_LIMITED's
        # batch); after an isolated job, nothing beside it (limit_alone).
        room = limit - len(leases)
        free = max(0, min(limit, step.free) - len(leases))
        # With no free slot, a queue with a rate would only be locked to claim nothing.
        queues = self.limited if free > 0 else self.ahead
        if room <= 0 or not queues:
            return leases
        for queue in protocol.lock_limited(cur, queues=queues):
            if room <= 0:
                break
            found = protocol.claim_limited(
                cur,
                owner=self.owner,
                queue=queue,
                limit=room,
                free=free,
                lease_seconds=self.lease_seconds,
                isolated=step.isolated,
            )
            leases += found
            room -= len(found)
            free = max(0, free - len(found))
            if step.isolated and found:
                break  # One isolated job, alone.
        return leases
