"""The handler slots of one worker process: threads that only run handlers.

The control loop hands claimed jobs to the pool's one queue; an awake slot
takes the next job, runs it through the executor and reports its outcome.
The pool also measures how long handlers take, which sizes the worker's
claim-ahead buffer.

Slots are woken by need, not by count. Python runs one thread at a time, so
ten threads woken for a queue of short jobs only take turns at the GIL (a
hand-over at each system call a handler makes, each costing more than a
short job) and finish no sooner than one would. So while the average
handler takes less than SHORT_JOB_SECONDS, the pool keeps one slot awake
per QUEUE_BUDGET_SECONDS of queued work, counted in the handlers' wall
time: jobs that wait on the network or the database get more slots than
jobs that only compute. A slot that finds more slots awake than the queue
needs goes back to sleep. Should every awake slot be inside one handler for
STALL_SECONDS while jobs wait (a short job that turned out long), `keep_up`,
which the control loop calls every pass, wakes one more. Longer jobs each
get a slot of their own, as many as there are slots.

Taking a job needs no lock: the queue is a deque, whose `popleft` hands each
job to one thread. The lock guards only who sleeps, who is abandoned and
whether the pool stops; a slot sleeps on a gate of its own (a lock that
`_wake` releases), so waking one slot wakes that one only.

Python cannot stop a thread. When the loop gives up on a handler that is
still running (its timeout passed), the pool abandons its slot: the thread
no longer counts as running, a new thread takes the slot, and the old one
ends when its handler returns, if ever. While MAX_ABANDONED such threads are
still stuck, a stuck handler keeps its slot instead. A thread still inside a
handler never keeps the process alive: the command exits without waiting for
it (`in_handlers`).
"""

from __future__ import annotations

import collections
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from ..attempts import Attempt, Outcome
from . import executor

DURATION_SMOOTHING = 0.1  # Weight of the newest duration in the moving average.
MAX_ABANDONED = 64  # Abandoned threads still stuck, at most; past that, no new slot.
SHORT_JOB_SECONDS = 0.001  # Below this average handler time, slots are woken by queued work.
QUEUE_BUDGET_SECONDS = 0.02  # Queued short work (wall time) per awake slot.
STALL_SECONDS = 0.01  # Every awake slot this long in one handler while jobs wait: wake one more.


@dataclass(slots=True, eq=False)
class Slot:
    gate: threading.Lock  # Held while the slot sleeps on it; `_wake` releases it.
    attempt: Attempt | None = None  # The job its handler runs now.
    abandoned: bool = False  # Given up on: it ends when its handler returns.
    asleep: bool = False


class SlotPool:
    def __init__(self, size: int, on_outcome: Callable[[Outcome], None]) -> None:
        self.size = size
        self.on_outcome = on_outcome
        self.lock = threading.Lock()  # Guards slots, sleeping, live, abandoned, stopping.
        self.ready: collections.deque[Attempt] = collections.deque()  # Not started yet.
        self.slots: list[Slot] = []
        self.sleeping: list[Slot] = []  # Asleep on their gates, the latest last.
        self.live = 0  # Slots not abandoned.
        self.abandoned = 0  # Threads given up on that are still inside their handler.
        self.stopping = False  # Slots end once the queue is empty.
        self.avg_duration: float | None = None  # Seconds, a moving average.
        self.names = itertools.count()

    def start(self) -> None:
        for _ in range(self.size):
            self.add_slot()

    def add_slot(self) -> None:
        gate = threading.Lock()
        gate.acquire()  # A slot that sleeps blocks here until woken.
        slot = Slot(gate)
        with self.lock:
            self.slots.append(slot)
            self.live += 1
        name = f"conveyor-slot-{next(self.names)}"
        threading.Thread(target=self.run_slot, args=(slot,), name=name, daemon=True).start()

    def stop(self) -> None:
        """Let each slot finish its current job and end (handlers are not interrupted)."""
        with self.lock:
            self.stopping = True
            self._wake(len(self.sleeping))

    def submit(self, attempts: list[Attempt]) -> None:
        if not attempts:
            return
        self.ready.extend(attempts)
        with self.lock:
            self._wake(self._to_wake())

    def long_jobs(self) -> bool:
        average = self.avg_duration
        return average is None or average >= SHORT_JOB_SECONDS

    def wanted(self) -> int:
        """Slots the queued jobs need awake: one per job when jobs are long, else
        one per QUEUE_BUDGET_SECONDS of queued work (at least one while any waits)."""
        queued = len(self.ready)
        if self.long_jobs() or not queued:
            return queued
        work = queued * (self.avg_duration or 0.0)
        return min(queued, max(1, math.ceil(work / QUEUE_BUDGET_SECONDS)))

    def awake(self) -> int:
        return self.live - len(self.sleeping)

    def _to_wake(self) -> int:
        """Under the lock: how many sleeping slots the queued jobs need woken. Long
        jobs: one per job beyond the awake slots between jobs (each takes one);
        short jobs: wanted() beyond every awake slot."""
        if not self.long_jobs():
            return self.wanted() - self.awake()
        between = sum(1 for s in self.slots if s.attempt is None and not (s.asleep or s.abandoned))
        return len(self.ready) - between

    def _wake(self, count: int) -> None:
        """Under the lock: wake up to `count` sleeping slots."""
        sleeping = self.sleeping
        for _ in range(min(count, len(sleeping))):
            slot = sleeping.pop()
            slot.asleep = False
            slot.gate.release()

    def keep_up(self, now: float) -> None:
        """Wake more slots when jobs wait that the awake ones will not take soon.

        `now` is time.monotonic(). Called by the control loop every pass. Long
        jobs: every waiting job gets a slot (the average may have grown past
        SHORT_JOB_SECONDS since they were queued, with few slots awake). Short
        jobs: one more slot when every awake one is stuck in a handler.
        """
        if not self.ready or not self.sleeping:
            return
        if self.long_jobs():
            with self.lock:
                self._wake(self._to_wake())
            return
        for slot in list(self.slots):
            if slot.abandoned or slot.asleep:
                continue
            attempt = slot.attempt
            if attempt is None or attempt.started_at is None:
                return  # Between jobs: it takes the next one.
            if now - attempt.started_at < STALL_SECONDS:
                return
        with self.lock:
            self._wake(1)

    def waiting(self) -> int:
        """Jobs no slot has started."""
        return len(self.ready)

    def running(self) -> int:
        return sum(1 for s in list(self.slots) if s.attempt is not None and not s.abandoned)

    def running_attempts(self) -> list[Attempt]:
        """The attempts whose handlers run now (not abandoned ones)."""
        return [s.attempt for s in list(self.slots) if s.attempt is not None and not s.abandoned]

    def in_handlers(self) -> int:
        """Threads inside a handler now, abandoned ones included."""
        return sum(1 for s in list(self.slots) if s.attempt is not None)

    def abandon(self, attempt: Attempt) -> bool:
        """The loop gave up on this running handler: a new thread takes its slot."""
        with self.lock:
            slot = next((s for s in self.slots if s.attempt is attempt and not s.abandoned), None)
            if slot is None or self.abandoned >= MAX_ABANDONED:
                return False
            slot.abandoned = True
            self.abandoned += 1
            self.live -= 1
        self.add_slot()
        return True

    def take_waiting(self) -> list[Attempt]:
        """Remove and return every job that no slot has started."""
        taken: list[Attempt] = []
        ready = self.ready
        while True:
            try:
                taken.append(ready.popleft())  # One at a time: a slot may take one meanwhile.
            except IndexError:
                return taken

    def rest(self, slot: Slot, *, surplus: bool) -> bool:
        """Sleep unless there is work for this slot; False: the slot ends.

        `surplus`: the slot has jobs to take but may be one too many awake.
        Decided under the lock, so that the last slot the queue needs stays.
        """
        with self.lock:
            if slot.abandoned:
                return False
            if self.ready:
                if not surplus or self.awake() <= self.wanted():
                    return True
            elif self.stopping:
                return False
            slot.asleep = True
            self.sleeping.append(slot)
        slot.gate.acquire()
        return not slot.abandoned

    def run_slot(self, slot: Slot) -> None:
        ready = self.ready
        while True:
            try:
                attempt = ready.popleft()
            except IndexError:
                if self.rest(slot, surplus=False):
                    continue
                break
            if attempt.lost:  # Handed back (or lost) before it started.
                continue
            slot.attempt = attempt
            attempt.started_at = time.monotonic()  # The executor sets attempt.timeout.
            try:
                outcome = executor.execute(attempt)
                executor.connection_hygiene()
            finally:
                attempt.finished_at = time.monotonic()
                slot.attempt = None
            if slot.abandoned:
                self.on_outcome(outcome)  # Stale: logged, counted, not written.
                break
            self.observe(attempt.finished_at - attempt.started_at)
            self.on_outcome(outcome)
            if (
                ready
                and not self.long_jobs()
                and self.awake() > self.wanted()
                and not self.rest(slot, surplus=True)
            ):
                break
        with self.lock:
            self.slots.remove(slot)
            if slot.abandoned:
                self.abandoned -= 1
            else:
                self.live -= 1
        connections.close_all()  # This thread's handler connections.

    def observe(self, seconds: float) -> None:
        previous = self.avg_duration
        if previous is None:
            self.avg_duration = seconds
        else:
            self.avg_duration = previous + DURATION_SMOOTHING * (seconds - previous)
