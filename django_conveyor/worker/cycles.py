"""A cycle of the control loop: write outcomes, claim, list what may start, in one commit.

A cycle writes the outcomes that came back from the slots, claims new work
and, when the claim-ahead buffer is deeper than the start window, lists what
the slots may start (starts.py). It has three phases, each a method of the
worker (loop.py):

1. `prepare`: the pending outcomes are taken out of `Holdings.pending` (in
   flight from then on) and the claim is planned: a `Cycle`;
2. `execute`: its statements on the loop's connection, in one transaction,
   returning what the database did (`CycleResult`) or raising; it changes
   nothing of the worker's, so a failed cycle leaves nothing half-applied;
3. `finish`: the written outcomes are settled and reported, the claimed jobs
   go to the slots; after a failure the outcomes are pending again (they are
   written again, fenced) and the error goes up to the loop.

The common cycle, completions and one plain claim, is `pipelined`: BEGIN,
COMPLETE and CLAIM go to PostgreSQL together (psycopg's pipeline mode), and
COMMIT after the completions were read, two round trips where the plain form
takes four. Everything else (retries, failures, limited queues, isolated
jobs, a list to write) runs its statements one by one, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol import Lease
from .attempts import Outcome
from .claims import ClaimStep
from .outcomes import EachWritten
from .starts import StartPlan


@dataclass(slots=True, eq=False)
class Cycle:
    """What a cycle writes and claims, decided before any statement runs."""

    batch: dict[int, Outcome]  # Job id -> the outcome to write (in flight meanwhile).
    steps: list[ClaimStep]  # The claim statements, in order.
    now: float  # time.monotonic() when planned.
    room: int  # Jobs the slots' queue takes to be full (starts.py).
    window: int  # The start window: how deep the slots' queue may be.
    statements: int  # Statements it may run: above one, they share a transaction.
    lists: bool  # May write the list of what may start (starts.py).
    pipelined: bool  # Completions and one plain claim, sent together.


@dataclass(slots=True, eq=False)
class CycleResult:
    """What the database did: committed (`execute` raises instead of returning otherwise)."""

    written: dict[int, str]  # Job id -> what it became; missing: the fence refused it.
    claimed: list[Lease]
    plan: StartPlan
    each: EachWritten | None = None  # The batch was refused and written one by one.
