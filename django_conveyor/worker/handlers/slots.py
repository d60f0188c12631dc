"""The handler slots of one worker process: threads that only run handlers.

The control loop hands claimed jobs to the pool; each slot takes work from
one shared queue, runs it through the executor and reports each outcome
back. The pool also measures how long handlers take, which sizes the
worker's claim-ahead buffer.

Short jobs are handed over in batches: while the average handler takes
less than BATCH_BELOW_SECONDS, a slot takes up to MAX_BATCH jobs at once
(its share of the queue), so that a thread is woken once per batch rather
than once per job; each job of the batch still starts, times out and
reports on its own. Jobs a slot has taken and not started still count as
waiting, and are handed back at shutdown as the queue's are. Longer jobs
go one at a time, so they spread over the slots.

Python cannot stop a thread. When the loop gives up on a handler that is
still running (its timeout passed), the pool abandons its slot: the thread
no longer counts as running, a new thread takes the slot (and the jobs the
old one had taken and not started), and the old one ends when its handler
returns, if ever. While MAX_ABANDONED such threads are still stuck, a stuck
handler keeps its slot instead. A thread still inside a handler never keeps
the process alive: the command exits without waiting for it (`in_handlers`).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from django.db import connections

from ..attempts import Attempt, Outcome
from . import executor

DURATION_SMOOTHING = 0.1  # Weight of the newest duration in the moving average.
MAX_ABANDONED = 64  # Abandoned threads still stuck, at most; past that, no new slot.
MAX_BATCH = 16  # Jobs a slot takes at once, at most.
BATCH_BELOW_SECONDS = 0.001  # Batches only while the average handler is shorter.


@dataclass(slots=True, eq=False)
class Slot:
    attempt: Attempt | None = None  # The job its handler runs now.
    abandoned: bool = False  # Given up on: it ends when its handler returns.
    taken: collections.deque[Attempt] = field(default_factory=collections.deque)


class SlotPool:
    def __init__(self, size: int, on_outcome: Callable[[Outcome], None]) -> None:
        self.size = size
        self.on_outcome = on_outcome
        self.lock = threading.Lock()  # Guards everything below but avg_duration.
        self.work = threading.Condition(self.lock)  # Jobs queued, or a stop.
        self.ready: collections.deque[Attempt] = collections.deque()
        self.stops = 0  # Slots asked to end once the queue is empty.
        self.busy = 0  # Slots (not abandoned) running a handler.
        self.slots: list[Slot] = []
        self.abandoned = 0  # Threads given up on that are still inside their handler.
        self.avg_duration: float | None = None  # Seconds, a moving average.
        self.names = itertools.count()

    def start(self) -> None:
        for _ in range(self.size):
            self.add_slot()

    def add_slot(self, taken: Iterable[Attempt] = ()) -> None:
        slot = Slot(taken=collections.deque(taken))
        with self.lock:
            self.slots.append(slot)
        name = f"conveyor-slot-{next(self.names)}"
        threading.Thread(target=self.run_slot, args=(slot,), name=name, daemon=True).start()

    def stop(self) -> None:
        """Let each slot finish its current job and end (handlers are not interrupted)."""
        with self.work:
            self.stops += sum(not slot.abandoned for slot in self.slots)
            self.work.notify_all()

    def submit(self, attempts: list[Attempt]) -> None:
        if not attempts:
            return
        with self.work:
            self.ready.extend(attempts)
            self.work.notify(len(attempts))

    def waiting(self) -> int:
        """Jobs no slot has started: queued, or taken by a slot for its batch."""
        with self.lock:
            return len(self.ready) + sum(len(slot.taken) for slot in self.slots)

    def running(self) -> int:
        with self.lock:
            return self.busy

    def in_handlers(self) -> int:
        """Threads inside a handler now, abandoned ones included."""
        with self.lock:
            return sum(slot.attempt is not None for slot in self.slots)

    def abandon(self, attempt: Attempt) -> bool:
        """The loop gave up on this running handler: a new thread takes its slot."""
        with self.lock:
            slot = next((s for s in self.slots if s.attempt is attempt and not s.abandoned), None)
            if slot is None or self.abandoned >= MAX_ABANDONED:
                return False
            slot.abandoned = True
            self.abandoned += 1
            self.busy -= 1
            taken, slot.taken = slot.taken, collections.deque()
        self.add_slot(taken)  # The batch it had not started goes to its successor.
        return True

    def take_waiting(self) -> list[Attempt]:
        """Remove and return every job that no slot has started."""
        with self.lock:
            taken = list(self.ready)
            self.ready.clear()
            for slot in self.slots:
                taken += slot.taken
                slot.taken.clear()
        return taken

    def next_attempt(self, slot: Slot) -> Attempt | None:
        """The slot's next job: from its batch, else a new batch (waiting for one); None: end."""
        with self.work:
            while not slot.taken:
                if slot.abandoned:
                    return None
                if self.ready:
                    slot.taken.extend(self.ready.popleft() for _ in range(self.batch_size()))
                    break
                if self.stops:
                    self.stops -= 1
                    return None
                self.work.wait()
            attempt = slot.taken.popleft()
            self.busy += 1
            slot.attempt = attempt
            return attempt

    def batch_size(self) -> int:
        """Under the lock: this slot's share of the queue, if jobs are short."""
        average = self.avg_duration
        if average is None or average >= BATCH_BELOW_SECONDS:
            return 1
        live = max(1, sum(not slot.abandoned for slot in self.slots))
        return max(1, min(MAX_BATCH, len(self.ready) // live, len(self.ready)))

    def run_slot(self, slot: Slot) -> None:
        while (attempt := self.next_attempt(slot)) is not None:
            if attempt.lost:  # Handed back (or lost) before it started.
                self.finish(slot)
                continue
            attempt.started_at = time.monotonic()  # The executor sets attempt.timeout.
            try:
                outcome = executor.execute(attempt)
                executor.connection_hygiene()
            finally:
                attempt.finished_at = time.monotonic()
                self.finish(slot)
            if not slot.abandoned:
                self.observe(attempt.finished_at - attempt.started_at)
            self.on_outcome(outcome)  # Stale if abandoned: logged, counted, not written.
        with self.lock:
            self.slots.remove(slot)
            if slot.abandoned:
                self.abandoned -= 1
        connections.close_all()  # This thread's handler connections.

    def finish(self, slot: Slot) -> None:
        with self.lock:
            slot.attempt = None
            if not slot.abandoned:
                self.busy -= 1

    def observe(self, seconds: float) -> None:
        previous = self.avg_duration
        if previous is None:
            self.avg_duration = seconds
        else:
            self.avg_duration = previous + DURATION_SMOOTHING * (seconds - previous)
