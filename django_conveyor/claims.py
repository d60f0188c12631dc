"""What a worker claims in each cycle: how many jobs, and with which statements.

The claim fills the free slots plus a claim-ahead buffer, so that a slot
that frees up does not wait for a claim's round trip. Unless it is fixed
(`CONVEYOR["PREFETCH"]` or `--prefetch`), the buffer holds about
CLAIM_AHEAD_SECONDS of work per slot: deep when jobs are short, about
nothing when they are long, so a worker does not hoard slow jobs that an
idle peer could run.

`Claimer.plan` says which claim statements the cycle runs and with what
limit; the cycle runs them in its transaction, after the outcomes. Today
that is one CLAIM (which skips paused queues and jobs not yet due in its
SQL, see protocol.CLAIM); a claim variant such as CLAIM_ISOLATED (issue 8)
is one more `ClaimStep` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from . import protocol
from .protocol import Cursor, Lease

CLAIM_AHEAD_SECONDS = 0.02  # Buffered work per slot: a few claim round trips.
MAX_PREFETCH = 256


@dataclass(frozen=True, slots=True)
class ClaimStep:
    statement: Callable[..., list[Lease]]  # A protocol claim: (cursor, owner, queues, ...).
    limit: int


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

    def prefetch(self, avg_duration: float | None) -> int:
        """How many claimed jobs may wait for a slot."""
        if self.fixed_prefetch is not None:
            return self.fixed_prefetch
        if avg_duration is None:
            return self.concurrency  # Nothing has run yet.
        per_slot = CLAIM_AHEAD_SECONDS / max(avg_duration, 1e-6)
        return min(MAX_PREFETCH, int(self.concurrency * per_slot))

    def room(self, *, running: int, waiting: int, avg_duration: float | None) -> int:
        """Jobs to claim now: the free slots and the buffer, minus jobs already waiting."""
        free = max(0, self.concurrency - running)
        return free + self.prefetch(avg_duration) - waiting

    def plan(self, *, running: int, waiting: int, avg_duration: float | None) -> list[ClaimStep]:
        room = self.room(running=running, waiting=waiting, avg_duration=avg_duration)
        return [ClaimStep(protocol.claim, room)] if room > 0 else []

    def claim(self, cur: Cursor, steps: list[ClaimStep]) -> list[Lease]:
        claimed: list[Lease] = []
        for step in steps:
            claimed += step.statement(
                cur,
                owner=self.owner,
                queues=self.queues,
                limit=step.limit,
                lease_seconds=self.lease_seconds,
            )
        return claimed
