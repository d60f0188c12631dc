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

from . import executor, protocol
from .conf import conveyor_settings
from .context import LeaseState
from .dbconn import connect
from .exceptions import ConveyorConfigurationError
from .executor import Outcome
from .listener import Listener
from .logs import log_job
from .outcomes import write_batch
from .scheduler import SchedulerService
from .slots import Held, SlotPool

logger = logging.getLogger("django_conveyor.worker")

RECONNECT_BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
REAP_BATCH = 500
CLAIM_AHEAD_SECONDS = 0.02  # Buffered work per slot: a few claim round trips.
MAX_PREFETCH = 256
EXIT_OK = 0
EXIT_ERROR = 1


def worker_database(queues: tuple[str, ...]) -> str:
    """The one database a worker's queues live in (a worker never spans shards)."""
    settings = conveyor_settings()
    by_alias: dict[str, list[str]] = {}
    for queue_name in queues:
        by_alias.setdefault(settings.database_for(queue_name), []).append(queue_name)
    if len(by_alias) > 1:
        spread = "; ".join(f"{', '.join(q)} on {a!r}" for a, q in sorted(by_alias.items()))
        raise ConveyorConfigurationError(
            f"A worker serves queues of one database, but these span several: {spread}. "
            "Run one worker per database."
        )
    return next(iter(by_alias), settings.DATABASE)


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
    cron: bool = True  # Run the scheduler service (periodic jobs); --no-cron turns it off.
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)


@dataclass
class Stats:
    counts: Counter[str] = field(default_factory=Counter)

    def add(self, name: str, n: int = 1) -> None:
        self.counts[name] += n


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        settings = conveyor_settings()
        self.options = options
        self.database = worker_database(options.queues)
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
        self.fixed_prefetch = settings.PREFETCH if options.prefetch is None else options.prefetch
        self.listen = settings.LISTEN if options.listen is None else options.listen
        # The listener DSN reaches CONVEYOR["DATABASE"]; shard workers use their own.
        self.listener_dsn = settings.LISTENER_DSN if self.database == settings.DATABASE else None

        self.held: dict[int, Held] = {}
        self.pending: dict[str, list[Outcome]] = {}  # Outcomes not yet committed.
        self.outcomes: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.wake_event = threading.Event()
        self.stopping = threading.Event()
        self.slots = SlotPool(options.concurrency, self.on_outcome)
        self.stats = Stats()
        self.conn: psycopg.Connection | None = None
        self.signals_seen = 0
        self.finished_attempts = 0
        self.scheduler = SchedulerService(database=self.database) if options.cron else None

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
        self.slots.start()
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
            self.slots.stop()
            if self.conn is not None:
                self.conn.close()
        logger.info(
            "worker %s stopped: %s", self.worker_id, dict(sorted(self.stats.counts.items()))
        )
        return EXIT_OK

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.options.stop_signals:
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
                now = time.monotonic()
                if now >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = now + self.heartbeat_seconds
                if now >= next_reap:
                    self.reap()
                    next_reap = now + self.reap_seconds
                self.expire_timeouts()
                if self.scheduler is not None and self.scheduler.due(now):
                    self.run_scheduler()
                claimed = self.cycle()
                failures = 0
            except Exception as exc:  # The loop logs and carries on.
                delay = RECONNECT_BACKOFF_SECONDS[min(failures, len(RECONNECT_BACKOFF_SECONDS) - 1)]
                failures += 1
                if isinstance(exc, psycopg.OperationalError):
                    logger.warning("database unavailable (%s); reconnecting in %.1fs", exc, delay)
                else:
                    logger.exception("control loop error; retrying in %.1fs", delay)
                self.drop_connection()  # Pending outcomes are written again, fenced.
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
            if self.scheduler is not None:
                timeout = min(timeout, self.scheduler.seconds_until_due(time.monotonic()))
            self.wake_event.wait(timeout)

    def idle(self) -> bool:
        """Nothing held, nothing running, nothing left to write."""
        busy = self.slots.running()
        return not self.held and not busy and self.outcomes.empty() and not self.pending

    def ensure_connection(self) -> None:
        if self.conn is None or self.conn.closed:
            # A listener DSN or poll-only mode means the main DSN may be a pooler.
            direct = self.listen and not self.listener_dsn
            self.conn = connect(self.database, prepare=direct)

    def drop_connection(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None

    def cursor(self) -> psycopg.Cursor:
        assert self.conn is not None
        return self.conn.cursor()

    def prefetch(self) -> int:
        """How many claimed jobs may wait for a slot.

        Unless fixed, the buffer holds about CLAIM_AHEAD_SECONDS of work per
        slot: enough that a slot never waits for a claim's round trip and
        commit when jobs are short, and about nothing when they are long, so
        a worker does not hoard slow jobs that an idle peer could run.
        """
        if self.fixed_prefetch is not None:
            return self.fixed_prefetch
        if self.slots.avg_duration is None:
            return self.concurrency
        per_slot = CLAIM_AHEAD_SECONDS / max(self.slots.avg_duration, 1e-6)
        return min(MAX_PREFETCH, int(self.concurrency * per_slot))

    def free_slots(self) -> int:
        busy = self.slots.running()
        return max(0, self.concurrency - busy) + self.prefetch() - self.slots.waiting()

    def heartbeat(self) -> None:
        """Renew every lease in one statement; a lease missing from the result is lost.

        A job inside its own context.atomic() is skipped by the statement (its
        row is locked) but not lost: the lock keeps the reaper off it. A job
        its guarded commit completed is done, not lost.
        """
        if not self.held:
            return
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
            if current is None or current.lease.version != version or job_id in renewed:
                continue
            if current.state.in_atomic or current.state.completed_in_atomic:
                continue
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
            if held.state.in_atomic:
                continue  # Its row is locked by its guarded block: decide once it ends.
            del self.held[held.lease.id]
            held.state.mark_lost(f"timed out after {held.timeout:g}s")
            error = {
                "exception_class_path": "builtins.TimeoutError",
                "traceback": f"The attempt ran past its timeout of {held.timeout:g} seconds.",
            }
            delay = executor.retry_delay(
                executor.task_or_none(held.lease.task_path), held.lease.attempt
            )
            with self.cursor() as cur:
                protocol.retry(
                    cur,
                    owner=self.worker_id,
                    failures=[(held.lease.id, held.lease.version, delay, error)],
                )
            self.stats.add("timed_out")
            log_job(logger, logging.WARNING, held.lease, "timed out after %gs", held.timeout)

    def run_scheduler(self) -> None:
        """One pass of the scheduler service; its own errors never stop the loop."""
        assert self.scheduler is not None
        try:
            with self.cursor() as cur:
                counts = self.scheduler.run_once(cur)
        except psycopg.OperationalError:
            raise  # The connection: the loop reconnects.
        except Exception:
            logger.exception("scheduler pass failed; next one in %.1fs", self.scheduler.interval)
            self.scheduler.failed()
            return
        for name, value in counts._asdict().items():
            if value:
                self.stats.add(name, value)

    # -- outcomes -------------------------------------------------------------

    def collect_outcomes(self) -> None:
        """Move finished attempts into `pending`, dropping those whose lease is gone."""
        while True:
            try:
                outcome = self.outcomes.get_nowait()
            except queue.Empty:
                return
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
            self.pending.setdefault(outcome.kind, []).append(outcome)

    def cycle(self, *, claim: bool = True) -> int:
        """Write pending outcomes and claim new work in one transaction: one commit.

        Outcomes stay pending until the commit succeeds, so a connection lost
        mid-cycle only means the same guarded writes are sent again.
        """
        self.collect_outcomes()
        limit = self.free_slots() if claim and not self.stopping.is_set() else 0
        if not self.pending and limit <= 0:
            return 0
        assert self.conn is not None
        # One statement is its own transaction in autocommit: skip BEGIN and
        # COMMIT round trips (an idle worker's claim is the latency path).
        statements = len(self.pending) + (limit > 0)
        transaction = self.conn.transaction() if statements > 1 else contextlib.nullcontext()
        with transaction, self.conn.cursor() as cur:
            written = {
                kind: write_batch(cur, self.worker_id, kind, batch)
                for kind, batch in self.pending.items()
            }
            leases = (
                protocol.claim(
                    cur,
                    owner=self.worker_id,
                    queues=self.queues,
                    limit=limit,
                    lease_seconds=self.lease_seconds,
                )
                if limit > 0
                else []
            )
        self.settle(written)
        for lease in leases:
            state = LeaseState(self.worker_id, lease.version, self.database, self.lease_seconds)
            held = Held(lease, state)
            self.held[lease.id] = held
            self.slots.submit(held)
        self.stats.add("claimed", len(leases))
        return len(leases)

    def settle(self, written: dict[str, dict[int, str]]) -> None:
        """After the commit: forget the written leases, count, log what was refused."""
        for kind, batch in self.pending.items():
            results = written[kind]
            for o in batch:
                self.held.pop(o.lease.id, None)
                label = results.get(o.lease.id)
                if label is None:
                    self.stats.add("stale_outcomes")
                    log_job(logger, logging.WARNING, o.lease, "stale outcome (%s) refused", kind)
                else:
                    self.stats.add(label)
        self.pending.clear()

    # -- slots ----------------------------------------------------------------

    def on_outcome(self, outcome: Outcome) -> None:
        """Called from a slot thread: queue the outcome and wake the control loop."""
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
                self.cycle(claim=False)
                if time.monotonic() >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = time.monotonic() + self.heartbeat_seconds
            except psycopg.Error as exc:
                logger.warning("database unavailable during shutdown (%s)", exc)
                self.drop_connection()
                time.sleep(0.2)
            self.wake_event.wait(0.05)
            self.wake_event.clear()
        try:
            self.ensure_connection()
            self.cycle(claim=False)
            self.release(list(self.held.values()), reason="shutdown timeout reached")
        except psycopg.Error as exc:
            logger.warning("could not hand back leases (%s): they will expire and be reaped", exc)

    def release_waiting(self) -> None:
        waiting = self.slots.take_waiting()
        try:
            self.ensure_connection()
            self.release(waiting, reason="never started")
        except psycopg.Error as exc:
            logger.warning("could not hand back leases (%s): they will expire and be reaped", exc)

    def release(self, helds: list[Held], *, reason: str) -> None:
        # A job inside its guarded block holds its row lock: handing it back
        # would wait for the block. It commits, or rolls back and is reaped.
        helds = [h for h in helds if not h.state.in_atomic]
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
