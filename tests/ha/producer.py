"""The failover run's producer: enqueue through Django, record every acknowledged commit.

It enqueues the way an application does (the task's `.enqueue()` inside
`transaction.atomic()`, on Django's own connection, configured with every
node), one job per transaction. A job counts as acknowledged only once its
commit returned; the producer then appends `seq job_id unix_time` to its
record file (flushed, so the record survives the producer). An error is the
caller's to retry, as any application's would be: it is recorded, the broken
connection closed (what Django does at the end of a failed request), and
the same enqueue tried again with the same idempotency key, so a commit
whose acknowledgement was lost is found, not enqueued twice.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RETRY_SECONDS = 0.1
MAX_ERROR_SAMPLES = 20


@dataclass(slots=True)
class EnqueueError:
    at: float  # Unix time.
    kind: str  # The exception's class.
    message: str


@dataclass(slots=True)
class Producer:
    jobs: int
    record: Path
    seed: int
    work_seconds: tuple[float, float]
    inside_seconds: tuple[float, float]
    acked: list[tuple[int, int, float]] = field(default_factory=list)  # seq, job id, time
    errors: list[EnqueueError] = field(default_factory=list)
    started_at: float = 0.0
    finished_at: float | None = None
    failure: BaseException | None = None
    thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Producer:
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(30)

    @property
    def done(self) -> bool:
        return self.finished_at is not None or self.failure is not None

    def _run(self) -> None:
        from django.db import connection

        self.started_at = time.time()
        rng = random.Random(self.seed)
        try:
            with open(self.record, "a", buffering=1) as record:
                for seq in range(self.jobs):
                    work = round(rng.uniform(*self.work_seconds), 3)
                    inside = round(rng.uniform(*self.inside_seconds), 3)
                    job_id = self._enqueue(seq, work, inside)
                    if job_id is None:
                        return  # Stopped.
                    now = time.time()
                    self.acked.append((seq, job_id, now))
                    record.write(f"{seq} {job_id} {now:.6f}\n")
            self.finished_at = time.time()
        except BaseException as exc:  # Reported by the run; the thread must not die silently.
            self.failure = exc
        finally:
            connection.close()

    def _enqueue(self, seq: int, work: float, inside: float) -> int | None:
        from django.db import Error, connection, transaction

        from tests.faults.tasks import apply_effect

        task = apply_effect.using(idempotency_key=self.key(seq))
        while not self.stopping.is_set():
            try:
                with transaction.atomic():
                    result = task.enqueue(work, inside)
                return int(result.id)
            except Error as exc:
                self.errors.append(EnqueueError(time.time(), type(exc).__name__, str(exc)[:300]))
                connection.close()
                self.stopping.wait(RETRY_SECONDS)
        return None

    @staticmethod
    def key(seq: int) -> str:
        return f"ha-{seq}"

    def summary(self, fault_at: float | None) -> dict[str, Any]:
        """The errors the application saw, relative to the fault."""

        def rel(t: float) -> float | None:
            return None if fault_at is None else round(t - fault_at, 2)

        kinds: dict[str, int] = {}
        for e in self.errors:
            kinds[e.kind] = kinds.get(e.kind, 0) + 1
        gaps = [b[2] - a[2] for a, b in zip(self.acked, self.acked[1:], strict=False)]
        longest = max(range(len(gaps)), key=gaps.__getitem__, default=None)
        return {
            "errors": len(self.errors),
            "errors_by_kind": kinds,
            "first_error_after_fault_s": rel(self.errors[0].at) if self.errors else None,
            "last_error_after_fault_s": rel(self.errors[-1].at) if self.errors else None,
            "error_samples": [
                {"after_fault_s": rel(e.at), "kind": e.kind, "message": e.message}
                for e in self.errors[:MAX_ERROR_SAMPLES]
            ],
            "longest_wait_between_acknowledgements_s": (
                None if longest is None else round(gaps[longest], 2)
            ),
            "longest_wait_began_after_fault_s": (
                None if longest is None else rel(self.acked[longest][2])
            ),
            "enqueue_rate_per_s": (
                round(len(self.acked) / (self.finished_at - self.started_at), 1)
                if self.finished_at
                else None
            ),
        }
