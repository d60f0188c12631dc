"""One worker process: a control loop, a pool of handler slots, and a listener.

The control loop owns the worker's database connection and does all of its
protocol traffic: it claims batches sized to the free slots (plus a small
claim-ahead buffer), writes the handlers' outcomes in batches, renews every
lease it holds in one heartbeat statement, and reaps expired leases. Slots
only run handlers. A handler that panics never kills its slot; a slot whose
handler overruns its timeout is given up on (its outcome becomes stale).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import FrameType

import psycopg
from django.db import connections

from . import executor, protocol
from .conf import conveyor_settings
from .context import LeaseState
from .dbconn import connect
from .executor import Outcome
from .listener import Listener
from .logs import log_job
from .protocol import Lease

logger = logging.getLogger("django_conveyor.worker")

RECONNECT_BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
REAP_BATCH = 500
EXIT_OK = 0
EXIT_ERROR = 1


def new_worker_id() -> str:
    """Unique per process incarnation, so a restarted worker never shares a token owner."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    queues: tuple[str, ...] = ("default",)
    concurrency: int = 4
    lease_seconds: float | None = None  # None: CONVEYOR["LEASE_SECONDS"].
    shutdown_timeout: float | None = None  # None: CONVEYOR["SHUTDOWN_TIMEOUT_SECONDS"].
    burst: bool = False  # Exit 0 once nothing is ready and nothing is held.
    listen: bool | None = None  # None: CONVEYOR["LISTEN"]; False polls only.
    poll_seconds: float | None = None
    prefetch: int | None = None
    max_jobs: int | None = None  # Exit after this many attempts finished.
    worker_id: str | None = None


@dataclass(slots=True)
class Held:
    lease: Lease
    state: LeaseState
    started_at: float | None = None  # monotonic; None while buffered.
    timeout: float | None = None


@dataclass
class Stats:
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        settings = conveyor_settings()
        self.options = options
        self.database = settings.DATABASE
        self.worker_id = options.worker_id or new_worker_id()
        self.queues = tuple(options.queues)
        self.concurrency = options.concurrency
        self.lease_seconds = options.lease_seconds or settings.LEASE_SECONDS
        self.heartbeat_seconds = min(settings.HEARTBEAT_SECONDS, self.lease_seconds / 3)
        self.shutdown_timeout = (
            settings.SHUTDOWN_TIMEOUT_SECONDS
            if options.shutdown_timeout is None
            else options.shutdown_timeout
        )
        self.poll_seconds = options.poll_seconds or settings.POLL_SECONDS
        self.reap_seconds = settings.REAP_SECONDS
        prefetch = settings.PREFETCH if options.prefetch is None else options.prefetch
        self.prefetch = prefetch or options.concurrency
        self.listen = settings.LISTEN if options.listen is None else options.listen
        self.listener_dsn = settings.LISTENER_DSN

        self.held: dict[int, Held] = {}
        self.ready: queue.SimpleQueue[Held | None] = queue.SimpleQueue()
        self.outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.wake_event = threading.Event()
        self.stopping = threading.Event()
        self.busy_slots = 0
        self.busy_lock = threading.Lock()
        self.stats = Stats()
        self.conn: psycopg.Connection | None = None
        self.signals_seen = 0
        self.finished_attempts = 0

    # -- lifecycle -----------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (or, in burst mode, until nothing is ready)."""
        self.install_signal_handlers()
        logger.info(
            "worker %s starting: queues=%s concurrency=%d lease=%.1fs %s",
            self.worker_id,
            ",".join(self.queues),
            self.concurrency,
            self.lease_seconds,
            "listen+poll" if self.listen else "poll-only",
        )
        slots = [
            threading.Thread(target=self.slot_loop, name=f"conveyor-slot-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for slot in slots:
            slot.start()
        if self.listen:
            Listener(
                database=self.database,
                dsn=self.listener_dsn,
                queues=frozenset(self.queues),
                wake=self.wake_event.set,
                stopping=self.stopping,
            ).start()
        try:
            self.control_loop()
            self.shut_down()
        finally:
            for _ in slots:
                self.ready.put(None)
            if self.conn is not None:
                self.conn.close()
        logger.info(
            "worker %s stopped: %s", self.worker_id, dict(sorted(self.stats.counts.items()))
        )
        return EXIT_OK

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals_seen += 1
        if self.signals_seen > 1:
            # Second signal: stop at once; leases we hold expire and are reaped.
            os.write(
                2, f"conveyor worker: {signal.Signals(signum).name} again, exiting now\n".encode()
            )
            os._exit(128 + signum)
        logger.info("%s received: finishing in-flight jobs", signal.Signals(signum).name)
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        self.wake_event.set()

    # -- the control loop ----------------------------------------------------

    def control_loop(self) -> None:
        next_heartbeat = next_reap = time.monotonic()
        failures = 0
        while not self.stopping.is_set():
            self.wake_event.clear()  # Wake-ups during this pass keep the next wait short.
            try:
                self.ensure_connection()
                self.flush_outcomes()
                now = time.monotonic()
                if now >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = now + self.heartbeat_seconds
                if now >= next_reap:
                    self.reap()
                    next_reap = now + self.reap_seconds
                self.expire_timeouts()
                claimed = self.claim()
                failures = 0
            except psycopg.OperationalError as exc:
                delay = RECONNECT_BACKOFF_SECONDS[min(failures, len(RECONNECT_BACKOFF_SECONDS) - 1)]
                failures += 1
                logger.warning("database unavailable (%s); reconnecting in %.1fs", exc, delay)
                self.drop_connection()
                self.stopping.wait(delay)
                continue
            if self.options.max_jobs and self.finished_attempts >= self.options.max_jobs:
                logger.info("max jobs reached (%d): stopping", self.finished_attempts)
                self.stop()
                break
            if claimed:
                continue  # There may be more ready work: claim again before sleeping.
            if self.options.burst and self.idle():
                logger.info("burst: nothing ready and nothing held, exiting")
                break
            timeout = min(self.poll_seconds, max(next_heartbeat - time.monotonic(), 0.0))
            self.wake_event.wait(timeout)

    def idle(self) -> bool:
        """Nothing held, nothing running, nothing left to write."""
        with self.busy_lock:
            busy = self.busy_slots
        return not self.held and not busy and self.outcomes.empty()

    def ensure_connection(self) -> None:
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.database, prepare=self.listen)

    def drop_connection(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None

    def cursor(self) -> psycopg.Cursor:
        assert self.conn is not None
        return self.conn.cursor()

    def free_slots(self) -> int:
        with self.busy_lock:
            busy = self.busy_slots
        waiting = sum(1 for h in self.held.values() if h.started_at is None)
        return max(0, self.concurrency - busy) + self.prefetch - waiting

    def claim(self) -> int:
        if self.stopping.is_set():
            return 0
        limit = self.free_slots()
        if limit <= 0:
            return 0
        with self.cursor() as cur:
            leases = protocol.claim(
                cur,
                owner=self.worker_id,
                queues=self.queues,
                limit=limit,
                lease_seconds=self.lease_seconds,
            )
        for lease in leases:
            held = Held(lease, LeaseState(self.worker_id, lease.version))
            self.held[lease.id] = held
            self.ready.put(held)
        self.stats.add("claimed", len(leases))
        return len(leases)

    def heartbeat(self) -> None:
        if not self.held:
            return
        # A job completed inside context.atomic() is no longer 'running': it needs
        # no renewal, and its missing row means done, not lost.
        held = [
            (h.lease.id, h.lease.version)
            for h in self.held.values()
            if not h.state.completed_in_atomic
        ]
        with self.cursor() as cur:
            renewed = protocol.heartbeat(
                cur, owner=self.worker_id, held=held, lease_seconds=self.lease_seconds
            )
        for job_id, version in held:
            current = self.held.get(job_id)
            if (
                job_id not in renewed
                and current
                and current.lease.version == version
                and not current.state.completed_in_atomic
            ):
                current.state.mark_lost("heartbeat found the lease gone")
                del self.held[job_id]
                self.stats.add("leases_lost")
                log_job(
                    logger,
                    logging.WARNING,
                    current.lease,
                    "lease lost: its outcome will not be written",
                )

    def reap(self) -> None:
        with self.cursor() as cur:
            reaped = protocol.reap(cur, limit=REAP_BATCH)
        for row in reaped:
            logger.warning(
                "job=%s task=%s queue=%s attempt=%s token=%s reaped from worker %s: "
                "lease expired -> %s",
                row.id, row.task_path, row.queue, row.attempt, row.version, row.owner, row.state,
            )  # fmt: skip
        self.stats.add("reaped", len(reaped))

    def expire_timeouts(self) -> None:
        """Give up on attempts past their task timeout: retry them under the fence."""
        now = time.monotonic()
        for held in list(self.held.values()):
            if held.started_at is None or held.timeout is None:
                continue
            if now - held.started_at < held.timeout:
                continue
            del self.held[held.lease.id]
            held.state.mark_lost(f"timed out after {held.timeout:g}s")
            error = {
                "exception_class_path": "builtins.TimeoutError",
                "traceback": f"The attempt ran past its timeout of {held.timeout:g} seconds.",
            }
            delay = executor.backoff_delay(
                held.lease.attempt,
                conveyor_settings().BACKOFF_BASE_SECONDS,
                conveyor_settings().BACKOFF_CAP_SECONDS,
            )
            with self.cursor() as cur:
                protocol.retry(
                    cur,
                    owner=self.worker_id,
                    failures=[(held.lease.id, held.lease.version, delay, error)],
                )
            self.stats.add("timed_out")
            log_job(logger, logging.WARNING, held.lease, "timed out after %gs", held.timeout)

    # -- outcomes -------------------------------------------------------------

    def flush_outcomes(self) -> None:
        """Write every finished attempt's outcome, batched by kind, each row fenced."""
        batch: dict[str, list[Outcome]] = {}
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                break
            self.finished_attempts += 1
            current = self.held.get(outcome.lease.id)
            stale = current is None or current.lease.version != outcome.lease.version
            # The guarded commit already proved the token held: never stale.
            if stale and outcome.kind != executor.DONE_IN_ATOMIC:
                # The lease was lost (heartbeat, timeout or shutdown): never write.
                self.stats.add("stale_outcomes")
                log_job(
                    logger,
                    logging.WARNING,
                    outcome.lease,
                    "stale outcome (%s) not written",
                    outcome.kind,
                )
                continue
            batch.setdefault(outcome.kind, []).append(outcome)
        if not batch:
            return
        with self.cursor() as cur:
            for kind, outcomes in batch.items():
                written = self.write(cur, kind, outcomes)
                for o in outcomes:
                    self.held.pop(o.lease.id, None)
                    if o.lease.id not in written:
                        self.stats.add("stale_outcomes")
                        log_job(
                            logger,
                            logging.WARNING,
                            o.lease,
                            "stale outcome (%s) rejected by the fence",
                            kind,
                        )

    def write(self, cur: psycopg.Cursor, kind: str, outcomes: list[Outcome]) -> set[int]:
        owner = self.worker_id
        if kind == executor.COMPLETE:
            written = protocol.complete(
                cur,
                owner=owner,
                done=[(o.lease.id, o.lease.version, o.return_value) for o in outcomes],
            )
            self.stats.add("completed", len(written))
            return written
        if kind == executor.RETRY:
            states = protocol.retry(
                cur,
                owner=owner,
                failures=[(o.lease.id, o.lease.version, o.delay, o.error) for o in outcomes],
            )
            for state in states.values():
                self.stats.add("dead" if state == "dead" else "retried")
            return set(states)
        if kind == executor.FAIL:
            written = protocol.fail(
                cur,
                owner=owner,
                failures=[(o.lease.id, o.lease.version, o.error) for o in outcomes],
            )
            self.stats.add("failed", len(written))
            return written
        if kind == executor.SNOOZE:
            written = protocol.snooze(
                cur, owner=owner, snoozed=[(o.lease.id, o.lease.version, o.delay) for o in outcomes]
            )
            self.stats.add("snoozed", len(written))
            return written
        if kind == executor.DONE_IN_ATOMIC:
            # context.atomic() already completed these; store what they returned.
            protocol.record_result(
                cur,
                owner=owner,
                done=[(o.lease.id, o.lease.version, o.return_value) for o in outcomes],
            )
            self.stats.add("completed", len(outcomes))
            return {o.lease.id for o in outcomes}
        # LOST: the guarded transaction refused the handler; nothing to write.
        self.stats.add("stale_outcomes", len(outcomes))
        return {o.lease.id for o in outcomes}

    # -- slots ----------------------------------------------------------------

    def slot_loop(self) -> None:
        while True:
            held = self.ready.get()
            if held is None:
                connections.close_all()  # This thread's handler connections.
                return
            if held.state.lost.is_set():
                continue  # Handed back before it started.
            with self.busy_lock:
                self.busy_slots += 1
            held.timeout = executor.task_timeout(held.lease.task_path)
            held.started_at = time.monotonic()
            try:
                outcome = executor.execute(held.lease, held.state)
            finally:
                with self.busy_lock:
                    self.busy_slots -= 1
            self.outcomes.put(outcome)
            self.wake_event.set()

    # -- shutdown -------------------------------------------------------------

    def shut_down(self) -> None:
        """Hand back what has not started, wait for the rest, hand back leftovers."""
        self.release_waiting()
        deadline = time.monotonic() + self.shutdown_timeout
        next_heartbeat = time.monotonic()
        while self.held and time.monotonic() < deadline:
            try:
                self.ensure_connection()
                self.flush_outcomes()
                if time.monotonic() >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = time.monotonic() + self.heartbeat_seconds
            except psycopg.OperationalError as exc:
                logger.warning("database unavailable during shutdown (%s)", exc)
                self.drop_connection()
                time.sleep(0.2)
            self.wake_event.wait(0.05)
            self.wake_event.clear()
        try:
            self.ensure_connection()
            self.flush_outcomes()
            self.release(list(self.held.values()), reason="shutdown timeout reached")
        except psycopg.OperationalError as exc:
            logger.warning("could not hand back leases (%s): they will expire and be reaped", exc)

    def release_waiting(self) -> None:
        waiting = []
        while True:
            try:
                held = self.ready.get_nowait()
            except queue.Empty:
                break
            if held is not None:
                held.state.mark_lost("handed back unstarted at shutdown")
                waiting.append(held)
        try:
            self.ensure_connection()
            self.release(waiting, reason="never started")
        except psycopg.OperationalError as exc:
            logger.warning("could not hand back leases (%s): they will expire and be reaped", exc)

    def release(self, helds: list[Held], *, reason: str) -> None:
        if not helds:
            return
        for held in helds:
            held.state.mark_lost(f"handed back: {reason}")
            self.held.pop(held.lease.id, None)
        with self.cursor() as cur:
            released = protocol.release(
                cur, owner=self.worker_id, held=[(h.lease.id, h.lease.version) for h in helds]
            )
        self.stats.add("released", len(released))
        for held in helds:
            log_job(logger, logging.INFO, held.lease, "lease handed back (%s)", reason)
