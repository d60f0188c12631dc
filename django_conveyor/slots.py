"""The handler slots of one worker process: threads that only run handlers.

The control loop hands claimed jobs to the pool; each slot takes one, runs it
through the executor and reports the outcome back. The pool also measures how
long handlers take, which sizes the worker's claim-ahead buffer.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from django.db import connections

from . import executor
from .leases import HeldLease
from .outcomes import Outcome

DURATION_SMOOTHING = 0.1  # Weight of the newest duration in the moving average.


class SlotPool:
    def __init__(self, size: int, on_outcome: Callable[[Outcome], None]) -> None:
        self.size = size
        self.on_outcome = on_outcome
        self.ready: queue.SimpleQueue[HeldLease | None] = queue.SimpleQueue()
        self.busy_lock = threading.Lock()
        self.busy = 0
        self.avg_duration: float | None = None  # Seconds, a moving average.
        self.threads = [
            threading.Thread(target=self.run_slot, name=f"conveyor-slot-{i}", daemon=True)
            for i in range(size)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        """Let each slot finish its current job and end (handlers are not interrupted)."""
        for _ in self.threads:
            self.ready.put(None)

    def submit(self, held: HeldLease) -> None:
        self.ready.put(held)

    def waiting(self) -> int:
        return self.ready.qsize()

    def running(self) -> int:
        with self.busy_lock:
            return self.busy

    def take_waiting(self) -> list[HeldLease]:
        """Remove and return every job that no slot has started."""
        taken = []
        while True:
            try:
                held = self.ready.get_nowait()
            except queue.Empty:
                return taken
            if held is None:
                self.ready.put(None)  # A stop marker: keep it for its slot.
                return taken
            taken.append(held)

    def run_slot(self) -> None:
        while True:
            held = self.ready.get()
            if held is None:
                connections.close_all()  # This thread's handler connections.
                return
            if held.lost:
                continue  # Handed back before it started.
            with self.busy_lock:
                self.busy += 1
            held.started_at = time.monotonic()  # The executor sets held.timeout.
            try:
                outcome = executor.execute(held)
                executor.connection_hygiene()
            finally:
                held.finished_at = time.monotonic()
                with self.busy_lock:
                    self.busy -= 1
            self.observe(held.finished_at - held.started_at)
            self.on_outcome(outcome)

    def observe(self, seconds: float) -> None:
        previous = self.avg_duration
        if previous is None:
            self.avg_duration = seconds
        else:
            self.avg_duration = previous + DURATION_SMOOTHING * (seconds - previous)
