"""Which claimed jobs a worker may start: the ones its registry row lists.

A job claimed ahead that never started cannot have killed its worker. The
database can only tell it from one that did if the worker says, before a
handler touches a job, which jobs it may start: `conveyor_worker.may_start`
(protocol.DECLARE_STARTS). REAP then isolates only the listed jobs of a dead
worker and gives the others back with their attempt, so a deep claim-ahead
buffer costs nothing in crash containment.

The row's list is NULL while the worker claims for its slots and a short
window only (the old rule, and no extra statement on the latency path):
REAP then counts every job it holds as started. A claim that brings more
than the window makes the worker list what it may start and keep the rest
in `reserve`, never handed to a slot; each cycle tops the slots' queue up
from the reserve, listing the jobs it moves, about half a window at a time,
and checks (after the list is written) that their leases are still held.
When the reserve empties, the list goes back to NULL.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from .. import protocol
from ..protocol import Cursor, Lease
from .attempts import Attempt


@dataclass(slots=True)
class StartPlan:
    """What a cycle lists, decided after its claim, inside its transaction."""

    moved: list[Attempt] = field(default_factory=list)  # From the reserve to the slots.
    kept: set[int] = field(default_factory=set)  # Claimed now, to the reserve (job ids).
    held: set[int] = field(default_factory=set)  # Of `moved`, the ids whose lease still holds.
    wrote: bool = False  # DECLARE_STARTS ran: once committed, the row lists `listed`.
    listed: set[int] | None = None  # None: the row's list is NULL.


class StartWindow:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.reserve: collections.OrderedDict[int, Attempt] = collections.OrderedDict()
        self.listed: set[int] | None = None  # What the row lists; None: NULL, any held job.
        self.unsure = False  # A cycle that may have written the list failed: write it again.

    def waiting(self) -> int:
        return len(self.reserve)

    def idle(self) -> bool:
        """Nothing to list: the row's list is NULL (and known to be), nothing in reserve."""
        return self.listed is None and not self.unsure and not self.reserve

    def moving(self, room: int, window: int) -> bool:
        """Whether this cycle moves jobs from the reserve: the slots' queue has
        room for about half a window (so each move lists a batch, not a job)."""
        return bool(self.reserve) and self.has_room(room, window)

    @staticmethod
    def has_room(room: int, window: int) -> bool:
        return room >= max(1, window // 2)

    def take_all(self) -> list[Attempt]:
        """Remove and return the reserve (a shutdown hands it back)."""
        taken = list(self.reserve.values())
        self.reserve.clear()
        return taken

    def plan(
        self,
        cur: Cursor,
        claimed: Sequence[Lease],
        *,
        held: Callable[[], Iterable[int]],
        room: int,
        window: int,
    ) -> StartPlan:
        """List what the slots may start now, in the cycle's transaction.

        `room`: jobs the slots' queue takes to be full (free slots plus the
        window, minus what waits there); `window`: its depth. `held()`: the
        ids of every job whose outcome is not yet written, those just
        claimed excluded; called only when a list is written (it walks the
        whole buffer). Nothing here changes until `apply`, after the commit,
        but lost attempts met at the reserve's front, which leave it at once.
        """
        plan = StartPlan()
        if not self.unsure:
            if self.listed is None and len(claimed) <= max(room, 0):
                return plan  # Everything starts: the NULL list already says so.
            if self.listed is not None and not self.has_room(room, window):
                plan.kept = {lease.id for lease in claimed}  # The slots have enough for now.
                return plan
        plan.moved = self.front(max(room, 0))
        starting = [lease.id for lease in claimed[: max(room - len(plan.moved), 0)]]
        plan.kept = {lease.id for lease in claimed[len(starting) :]}
        if len(self.reserve) - len(plan.moved) + len(plan.kept):
            # Listed: what the slots hold or may start. At the switch from NULL
            # (or when unsure what the row says), every held job but the reserve.
            held_now = set(held())
            if self.listed is None or self.unsure:
                listed = held_now - self.reserve.keys()
            else:
                listed = self.listed & held_now
            plan.listed = listed | {a.lease.id for a in plan.moved} | set(starting)
        plan.wrote = True
        plan.held = protocol.declare_starts(
            cur,
            owner=self.owner,
            may_start=None if plan.listed is None else sorted(plan.listed),
            check=[(a.lease.id, a.lease.version) for a in plan.moved],
        )
        return plan

    def front(self, count: int) -> list[Attempt]:
        """Up to `count` attempts from the reserve's front, in claim order.

        An attempt a heartbeat found lost is dropped on the way (it is no
        longer held): only the front is read, never the whole reserve.
        """
        front: list[Attempt] = []
        dropped: list[int] = []
        for job_id, attempt in self.reserve.items():
            if len(front) >= count:
                break
            if attempt.lost:
                dropped.append(job_id)
            else:
                front.append(attempt)
        for job_id in dropped:
            del self.reserve[job_id]
        return front

    def statements(self) -> int:
        """Statements a plan may run: the list, and the check of the leases it moves."""
        return 2

    def failed(self) -> None:
        """The cycle did not commit, or not all of it: the row's list is unknown."""
        self.unsure = True

    def apply(self, plan: StartPlan, taken: list[Attempt]) -> tuple[list[Attempt], list[Attempt]]:
        """After the commit: (what the slots start, what was reaped before it started)."""
        if plan.wrote:
            self.listed, self.unsure = plan.listed, False
        start: list[Attempt] = []
        lost: list[Attempt] = []
        for attempt in plan.moved:
            del self.reserve[attempt.lease.id]
            (start if attempt.lease.id in plan.held else lost).append(attempt)
        for attempt in taken:
            if attempt.lease.id in plan.kept:
                self.reserve[attempt.lease.id] = attempt
            else:
                start.append(attempt)
        return start, lost
