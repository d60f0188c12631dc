"""Fault injectors: each a thread that strikes at random moments until told to stop.

They prefer victims that are mid-job (a worker id that holds a running job,
read from `conveyor_job.lease_owner`), so the faults land where they hurt.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from . import pg
from .workers import Incarnation, WorkerPool

logger = logging.getLogger("faults")

BUSY_WORKERS = """
SELECT lease_owner FROM conveyor_job
WHERE state = 'running' AND lease_expires_at > now()
GROUP BY lease_owner
"""


class Injector(threading.Thread):
    name_prefix = "injector"

    def __init__(self, *, rng: random.Random, stop: threading.Event, pace: float = 1.0) -> None:
        super().__init__(name=self.name_prefix, daemon=True)
        self.rng = rng
        self.pace = pace  # Multiplies the pauses between strikes.
        self.stopping = stop
        self.counts: Counter[str] = Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.strike()
        except BaseException as exc:
            self.error = exc
            logger.exception("%s failed", self.name)
        finally:
            self.recover()

    def strike(self) -> None:
        raise NotImplementedError

    def recover(self) -> None:
        """Leave the system whole when stopped (resume, restart)."""

    def pause(self, low: float, high: float) -> None:
        self.stopping.wait(self.rng.uniform(low, high) * self.pace)


class WorkerInjector(Injector):
    def __init__(self, *, pool: WorkerPool, db_port: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.pool = pool
        self.db_port = db_port

    def victim(self) -> tuple[Incarnation | None, bool]:
        """A worker holding a running job if there is one (True), else any live one."""
        rows = pg.query(self.db_port, BUSY_WORKERS) or []
        busy = [
            inc for (owner,) in rows if (inc := self.pool.by_worker_id(owner)) and not inc.frozen
        ]
        if busy:
            return self.rng.choice(busy), True
        with self.pool.lock:
            live = [i for i in self.pool.current.values() if not i.frozen and i.proc.poll() is None]
        return (self.rng.choice(live) if live else None), False


class Kill9(WorkerInjector):
    """SIGKILL a worker that holds a running job; start a new incarnation in its slot."""

    name_prefix = "kill9"

    def strike(self) -> None:
        self.pause(0.5, 2.0)
        if self.stopping.is_set():
            return
        inc, busy = self.victim()
        if inc is None or not busy:
            return  # Nobody is mid-job: wait for a better moment.
        if self.pool.kill_and_restart(inc):
            self.counts["kills"] += 1


class SigStop(WorkerInjector):
    """Freeze a busy worker past its lease, let others take over, then wake it."""

    name_prefix = "sigstop"

    def __init__(self, *, lease_seconds: float, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lease_seconds = lease_seconds
        self.frozen: Incarnation | None = None

    def strike(self) -> None:
        self.pause(0.3, 1.5)
        inc, busy = self.victim()
        if inc is None or not busy or self.stopping.is_set():
            return  # Only a worker that holds jobs can become a zombie.
        if not self.pool.signal(inc, signal.SIGSTOP):
            return
        inc.frozen, self.frozen = True, inc
        self.counts["freezes"] += 1
        # Past the lease and a reap pass or two: others reclaim its jobs meanwhile.
        frozen_for = self.lease_seconds * self.rng.uniform(1.6, 2.6)
        self.counts["frozen_ms"] += int(frozen_for * 1000)
        self.stopping.wait(frozen_for)
        self.thaw()

    def thaw(self) -> None:
        if self.frozen is not None:
            self.pool.signal(self.frozen, signal.SIGCONT)
            self.frozen.frozen, self.frozen = False, None

    def recover(self) -> None:
        self.thaw()


class Partition(WorkerInjector):
    """Cut a busy worker's host off the network past its lease, then heal it.

    Its connections hang (packets are dropped, nothing is refused), other
    hosts reap and rerun its jobs, and when the link comes back its late
    outcomes meet the fence. `cut` and `heal` take the worker's host name.
    """

    name_prefix = "partition"

    def __init__(
        self,
        *,
        lease_seconds: float,
        cut: Callable[[str], None],
        heal: Callable[[str], None],
        **kw: object,
    ) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.lease_seconds = lease_seconds
        self.cut, self.heal = cut, heal
        self.isolated: str | None = None

    def strike(self) -> None:
        self.pause(0.5, 2.0)
        inc, busy = self.victim()
        if inc is None or not busy or inc.host is None or self.stopping.is_set():
            return
        self.cut(inc.host)
        self.isolated = inc.host
        self.counts["partitions"] += 1
        cut_for = self.lease_seconds * self.rng.uniform(1.6, 2.6)
        self.counts["partitioned_ms"] += int(cut_for * 1000)
        self.stopping.wait(cut_for)
        self.recover()

    def recover(self) -> None:
        if self.isolated is not None:
            self.heal(self.isolated)
            self.isolated = None


# Sessions inside a guarded transaction (tests/faults/tasks.py names them).
IN_ATOMIC_SESSIONS = """
SELECT substr(application_name, length(%(prefix)s) + 1), now()
FROM pg_stat_activity
WHERE application_name LIKE %(prefix)s || '%%' AND state LIKE 'idle in transaction%%'
"""


class SigStopInAtomic(WorkerInjector):
    """Freeze a worker while it is inside context.atomic(); never continue it.

    The frozen process keeps its connection and its guarded transaction's row
    lock, which REAP skips: only the bound on the guarded transaction (one
    lease of idleness) frees the job. A new incarnation replaces the frozen
    one in its slot; the frozen ones are continued at the very end, when
    their commits must fail.
    """

    name_prefix = "sigstop-atomic"

    def __init__(self, *, prefix: str, max_freezes: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.prefix = prefix
        self.max_freezes = max_freezes  # Each leaves a frozen process behind until the end.
        self.frozen: list[Incarnation] = []
        self.held: list[dict[str, object]] = []  # What each freeze caught, for the report.

    def strike(self) -> None:
        self.pause(1.0, 3.0)
        if self.stopping.is_set() or len(self.frozen) >= self.max_freezes:
            return
        rows = pg.query(self.db_port, IN_ATOMIC_SESSIONS, {"prefix": self.prefix}) or []
        inside = []
        for name, at in rows:
            worker_id, job_id, token = name.split()
            inc = self.pool.by_worker_id(worker_id)
            if inc is not None and not inc.frozen:
                inside.append((inc, int(job_id), int(token), at))
        if not inside:
            return
        inc, job_id, token, at = self.rng.choice(inside)
        if not self.pool.signal(inc, signal.SIGSTOP):
            return
        inc.frozen = True
        self.frozen.append(inc)
        self.held.append({"worker": inc.worker_id, "job": job_id, "token": token, "at": at})
        self.counts["freezes_inside_atomic"] += 1
        self.pool.spawn(inc.slot)  # The frozen process stays, out of the pool.

    def recover(self) -> None:
        for inc in self.frozen:
            self.pool.signal(inc, signal.SIGCONT)
            inc.frozen = False


class PgRestart(Injector):
    """Stop PostgreSQL in immediate mode, keep it down a moment, start it again."""

    name_prefix = "pg-restart"

    def __init__(self, *, data_dir: Path, port: int, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.data_dir = data_dir
        self.port = port
        self.down = False

    def strike(self) -> None:
        self.pause(1.5, 4.0)
        if self.stopping.is_set():
            return
        pg.stop(self.data_dir, immediate=True)
        self.down = True
        self.counts["pg_restarts"] += 1
        down_for = self.rng.uniform(0.2, 1.5)
        self.counts["pg_down_ms"] += int(down_for * 1000)
        self.stopping.wait(down_for)
        self.bring_up()

    def bring_up(self) -> None:
        if self.down:
            pg.start(self.data_dir, self.port)
            self.down = False

    def recover(self) -> None:
        self.bring_up()
