"""The handler slots of one worker process: threads that only run handlers.

The control loop hands claimed jobs to the pool; each slot takes one, runs it
through the executor and reports the outcome back. The pool also measures how
long handlers take, which sizes the worker's claim-ahead buffer.

Python cannot stop a thread. When the loop gives up on a handler that is
still running (its timeout passed), the pool abandons its slot: the thread
no longer counts as running, a new thread takes the slot, and the old one
ends when its handler returns, if ever. While MAX_ABANDONED such threads
are still stuck, a stuck handler keeps its slot instead. A thread still inside
a handler never keeps the process alive: the command exits without waiting
for it (`in_handlers`).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from ..attempts import Attempt, Outcome
from . import executor

DURATION_SMOOTHING = 0.1  # Weight of the newest duration in the moving average.
MAX_ABANDONED = 64  # Abandoned threads still stuck, at most; past that, no new slot.


@dataclass(slots=True, eq=False)
class Slot:
    attempt: Attempt | None = None  # The job its handler runs now.
    abandoned: bool = False  # Given up on: it ends when its handler returns.


class SlotPool:
    def __init__(self, size: int, on_outcome: Callable[[Outcome], None]) -> None:
        self.size = size
        self.on_outcome = on_outcome
        self.ready: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()
        self.busy_lock = threading.Lock()
        self.busy = 0  # Slots (not abandoned) running a handler.
        self.slots: list[Slot] = []
        self.abandoned = 0  # Threads given up on that are still inside their handler.
        self.avg_duration: float | None = None  # Seconds, a moving average.
        self.names = itertools.count()

    def start(self) -> None:
        for _ in range(self.size):
            self.add_slot()

    def add_slot(self) -> None:
        slot = Slot()
        with self.busy_lock:
            self.slots.append(slot)
        name = f"conveyor-slot-{next(self.names)}"
        threading.Thread(target=self.run_slot, args=(slot,), name=name, daemon=True).start()

    def stop(self) -> None:
        """Let each slot finish its current job and end (handlers are not interrupted)."""
        with self.busy_lock:
            live = sum(not slot.abandoned for slot in self.slots)
        for _ in range(live):
            self.ready.put(None)

    def submit(self, attempt: Attempt) -> None:
        self.ready.put(attempt)

    def waiting(self) -> int:
        return self.ready.qsize()

    def running(self) -> int:
        with self.busy_lock:
            return self.busy

    def in_handlers(self) -> int:
        """Threads inside a handler now, abandoned ones included."""
        with self.busy_lock:
            return sum(slot.attempt is not None for slot in self.slots)

    def abandon(self, attempt: Attempt) -> bool:
        """The loop gave up on this running handler: a new thread takes its slot."""
        with self.busy_lock:
            slot = next((s for s in self.slots if s.attempt is attempt and not s.abandoned), None)
            if slot is None or self.abandoned >= MAX_ABANDONED:
                return False
            slot.abandoned = True
            self.abandoned += 1
            self.busy -= 1
        self.add_slot()
        return True

    def take_waiting(self) -> list[Attempt]:
        """Remove and return every job that no slot has started."""
        taken = []
        while True:
            try:
                attempt = self.ready.get_nowait()
            except queue.Empty:
                return taken
            if attempt is None:
                self.ready.put(None)  # A stop marker: keep it for its slot.
                return taken
            taken.append(attempt)

    def run_slot(self, slot: Slot) -> None:
        while not slot.abandoned:
            attempt = self.ready.get()
            if attempt is None:
                break
            if attempt.lost:
                continue  # Handed back before it started.
            with self.busy_lock:
                self.busy += 1
                slot.attempt = attempt
            attempt.started_at = time.monotonic()  # The executor sets attempt.timeout.
            try:
                outcome = executor.execute(attempt)
                executor.connection_hygiene()
            finally:
                attempt.finished_at = time.monotonic()
                with self.busy_lock:
                    slot.attempt = None
                    if not slot.abandoned:
                        self.busy -= 1
            if not slot.abandoned:
                self.observe(attempt.finished_at - attempt.started_at)
            self.on_outcome(outcome)  # Stale if abandoned: logged, counted, not written.
        with self.busy_lock:
            self.slots.remove(slot)
            if slot.abandoned:
                self.abandoned -= 1
        connections.close_all()  # This thread's handler connections.

    def observe(self, seconds: float) -> None:
        previous = self.avg_duration
        if previous is None:
            self.avg_duration = seconds
        else:
            self.avg_duration = previous + DURATION_SMOOTHING * (seconds - previous)
