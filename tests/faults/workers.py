"""Real `conveyor_worker` processes, each in a process group of its own.

Each incarnation of a worker slot gets its own worker id (`w<slot>.<n>`)
and its own log file, so the harness can tell which process holds which
lease (the id is the `lease_owner` column) and count what each one logged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETTINGS = "tests.faults.settings"
STOP_GRACE_SECONDS = 20.0


@dataclass(slots=True)
class Incarnation:
    slot: int
    number: int
    worker_id: str
    log: Path
    proc: subprocess.Popen[bytes]
    frozen: bool = False
    host: str | None = None  # The host it runs on (--hosts), else None.


@dataclass(frozen=True, slots=True)
class WorkerHost:
    """Where a slot's worker runs (--hosts): a command prefix and the database's address there."""

    name: str
    prefix: tuple[str, ...]  # e.g. ("ip", "netns", "exec", NAMESPACE)
    env: dict[str, str] = field(default_factory=dict)


class WorkerPool:
    def __init__(
        self,
        *,
        count: int,
        concurrency: int,
        db_port: int,
        log_dir: Path,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
        queue: str = "faults",  # The one queue served (tests/faults/settings.py: QUEUE).
        hosts: Sequence[WorkerHost] = (),  # Slot i runs on hosts[i % len(hosts)].
    ) -> None:
        self.hosts = tuple(hosts)
        self.queue = queue
        self.count = count
        self.concurrency = concurrency
        self.db_port = db_port
        self.log_dir = log_dir
        self.extra_args = extra_args  # Worker flags, e.g. --poll-only behind a pooler.
        self.extra_env = extra_env or {}
        self.lock = threading.RLock()
        self.current: dict[int, Incarnation] = {}
        self.history: list[Incarnation] = []

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env["DJANGO_SETTINGS_MODULE"] = SETTINGS
        env["CONVEYOR_FAULTS_PG_PORT"] = str(self.db_port)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.extra_env)
        return env

    def start_all(self) -> None:
        for slot in range(self.count):
            self.spawn(slot)

    def spawn(self, slot: int) -> Incarnation:
        with self.lock:
            number = sum(1 for inc in self.history if inc.slot == slot)
            worker_id = f"w{slot}.{number}"
            log = self.log_dir / f"worker-{worker_id}.log"
            host = self.hosts[slot % len(self.hosts)] if self.hosts else None
            env = self.env() if host is None else {**self.env(), **host.env}
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [
                        *(host.prefix if host else ()),
                        sys.executable,
                        "-m",
                        "django",
                        "conveyor_worker",
                        "-v",
                        "1",
                        "--queues",
                        self.queue,
                        "--concurrency",
                        str(self.concurrency),
                        "--worker-id",
                        worker_id,
                        *self.extra_args,
                    ],
                    cwd=REPO,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            inc = Incarnation(slot, number, worker_id, log, proc, host=host and host.name)
            self.current[slot] = inc
            self.history.append(inc)
            return inc

    def by_worker_id(self, worker_id: str) -> Incarnation | None:
        with self.lock:
            return next((i for i in self.current.values() if i.worker_id == worker_id), None)

    def signal(self, inc: Incarnation, signum: int) -> bool:
        """Signal the incarnation's process group; False if it is gone."""
        if inc.proc.poll() is not None:
            return False
        try:
            os.killpg(inc.proc.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def kill_and_restart(self, inc: Incarnation) -> bool:
        with self.lock:
            if self.current.get(inc.slot) is not inc or not self.signal(inc, signal.SIGKILL):
                return False
            inc.proc.wait(10)
            self.spawn(inc.slot)
            return True

    def respawn_exited(self) -> int:
        """Restart slots whose process exited on its own (it should not)."""
        restarted = 0
        with self.lock:
            for slot, inc in list(self.current.items()):
                if inc.proc.poll() is not None:
                    self.spawn(slot)
                    restarted += 1
        return restarted

    def stop_all(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGCONT then SIGTERM every process; SIGKILL what is left after `grace`."""
        with self.lock:
            incs = [inc for inc in self.history if inc.proc.poll() is None]
            for inc in incs:
                self.signal(inc, signal.SIGCONT)
                self.signal(inc, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for inc in incs:
                try:
                    inc.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self.signal(inc, signal.SIGKILL)
                    inc.proc.wait(10)
