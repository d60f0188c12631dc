"""One worker process: a control loop that schedules services and runs cycles.

The control loop owns the worker's database connection and does all of its
protocol traffic. Each pass:

1. runs the maintenance services that are due: the heartbeat, the reaper,
   the timeouts and the cron scheduler (heartbeat.py, reaper.py,
   timeouts.py, scheduler.py; services.py says what a service is);
2. runs one cycle: write every pending outcome and claim new work, in one
   transaction (leases.py holds the leases and their outcomes, claims.py
   sizes and runs the claim);
3. sleeps until a NOTIFY (listener.py) or a finished handler wakes it, a
   service is due, or the poll interval passes.

Handlers run in slot threads (slots.py, executor.py). Signals and graceful
shutdown are in shutdown.py; `--processes` in supervisor.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import TypeVar

import psycopg

from . import outcomes, shutdown
from .backoff import WORKER_RECONNECT_SECONDS, Ladder
from .claims import Claimer
from .conf import MAX_INT, MAX_SECONDS, conveyor_settings
from .dbconn import LoopConnection
from .exceptions import ConveyorConfigurationError
from .gate_service import GatesService
from .heartbeat import Heartbeat, interval_for
from .instrument import Instrument, Stats
from .leases import Leases
from .listener import Listener
from .outcomes import Outcome
from .reaper import Reaper
from .registry import Registry, WorkerInfo
from .reporting import Reporter
from .scheduler import SchedulerService
from .services import Now, Schedule, Service
from .slots import SlotPool
from .timeouts import Timeouts

logger = logging.getLogger("django_conveyor.worker")

EXIT_OK = 0
MAX_CONCURRENCY = 1024  # Handler slots (threads) one process may run.
T = TypeVar("T")


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
    """What the command line (or a caller) asks for; None means the CONVEYOR setting."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 4
    lease_seconds: float | None = None  # CONVEYOR["LEASE_SECONDS"]
    shutdown_timeout: float | None = None  # CONVEYOR["SHUTDOWN_TIMEOUT_SECONDS"]
    burst: bool = False  # Exit 0 once nothing is ready and nothing is held.
    listen: bool | None = None  # CONVEYOR["LISTEN"]; False polls only.
    poll_seconds: float | None = None  # CONVEYOR["POLL_SECONDS"]
    prefetch: int | None = None  # CONVEYOR["PREFETCH"]
    max_jobs: int | None = None  # Exit after this many attempts finished.
    worker_id: str | None = None  # A new host:pid:random id.
    cron: bool = True  # Run the scheduler service (periodic jobs); --no-cron turns it off.
    stop_signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)
    supervised: bool = False  # A child of --processes: its supervisor decides on a hard stop.
    instrument: Instrument | None = None  # Metrics hook; None reports nothing.


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerConfig:
    """The options with every unset value taken from the settings: what the worker runs with."""

    queues: tuple[str, ...]
    concurrency: int
    database: str  # The alias of every queue served.
    worker_id: str
    lease_seconds: float
    heartbeat_seconds: float
    reap_seconds: float
    gates_seconds: float
    shutdown_timeout: float
    poll_seconds: float
    prefetch: int | None  # None adapts to job length.
    listen: bool
    listener_dsn: str | None

    @classmethod
    def resolve(cls, options: WorkerOptions) -> WorkerConfig:
        """The options completed from the settings; refuses values no worker can run with.

        The command's flags are checked by argparse already; this catches the
        same mistakes from code (and from processes that skip system checks).
        """
        settings = conveyor_settings()
        database = worker_database(options.queues)
        _check_count("concurrency", options.concurrency, 1, MAX_CONCURRENCY)
        if options.prefetch is not None:
            _check_count("prefetch", options.prefetch, 0, MAX_INT)
        for name in ("lease_seconds", "poll_seconds", "shutdown_timeout"):
            _check_seconds(name, getattr(options, name), zero=name == "shutdown_timeout")
        lease_seconds = _given(options.lease_seconds, settings.LEASE_SECONDS)
        return cls(
            queues=tuple(options.queues),
            concurrency=options.concurrency,
            database=database,
            worker_id=options.worker_id or new_worker_id(),
            lease_seconds=lease_seconds,
            heartbeat_seconds=interval_for(lease_seconds, settings.HEARTBEAT_SECONDS),
            reap_seconds=settings.REAP_SECONDS,
            gates_seconds=settings.GATES_SECONDS,
            shutdown_timeout=_given(options.shutdown_timeout, settings.SHUTDOWN_TIMEOUT_SECONDS),
            poll_seconds=_given(options.poll_seconds, settings.POLL_SECONDS),
            prefetch=_given(options.prefetch, settings.PREFETCH),
            listen=_given(options.listen, settings.LISTEN),
            # The listener DSN reaches CONVEYOR["DATABASE"]; shard workers use their own.
            listener_dsn=settings.LISTENER_DSN if database == settings.DATABASE else None,
        )


def _given(option: T | None, setting: T) -> T:
    return setting if option is None else option


def _check_count(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConveyorConfigurationError(
            f"The worker's {name} must be a whole number from {low} to {high}, not {value!r}."
        )


def _check_seconds(name: str, value: object, *, zero: bool) -> None:
    """None (the setting applies) or a finite number of seconds PostgreSQL can add to now()."""
    if value is None:
        return
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and (value >= 0 if zero else value > 0)
        and value <= MAX_SECONDS  # False for NaN and infinity too.
    )
    if not ok:
        low = "zero or more" if zero else "more than zero"
        raise ConveyorConfigurationError(
            f"The worker's {name} must be a number of seconds, {low} and at most "
            f"{MAX_SECONDS:.0f} (ten years), not {value!r}."
        )


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.config = config = WorkerConfig.resolve(options)
        self.worker_id = config.worker_id
        self.stats = Stats()
        self.instrument = options.instrument  # None: no event is even called.
        self.leases = Leases(
            config.worker_id,
            config.database,
            self.stats,
            self.instrument,
            lease_seconds=config.lease_seconds,
        )
        self.slots = SlotPool(config.concurrency, self.on_outcome)
        self.reporter = Reporter()  # task_finished, once an outcome committed.
        self.claimer = Claimer(
            owner=config.worker_id,
            queues=config.queues,
            concurrency=config.concurrency,
            lease_seconds=config.lease_seconds,
            prefetch=config.prefetch,
        )
        self.heartbeat = Heartbeat(
            self.leases, lease_seconds=config.lease_seconds, interval=config.heartbeat_seconds
        )
        self.registry = Registry(
            WorkerInfo(id=config.worker_id, queues=config.queues, concurrency=config.concurrency),
            leases_held=lambda: len(self.leases.held),
            interval=config.heartbeat_seconds,
        )
        self.schedule = Schedule(self.services(), self.stats)
        # A listener DSN or poll-only mode means the main DSN may be a pooler.
        self.connection = LoopConnection(
            config.database, prepare=config.listen and not config.listener_dsn
        )
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.signals = shutdown.StopSignals(
            self.stop, options.stop_signals, repeat_is_hard=not options.supervised
        )

    def services(self) -> list[Service]:
        """The maintenance services the control loop schedules, in the order a pass runs them."""
        services: list[Service] = [
            self.heartbeat,
            Reaper(interval=self.config.reap_seconds),
            GatesService(database=self.config.database, interval=self.config.gates_seconds),
            Timeouts(self.leases, abandon=self.slots.abandon),
            self.registry,
        ]
        if self.options.cron:
            services.append(SchedulerService(database=self.config.database))
        return services

    # -- lifecycle -----------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (or, in burst mode, until nothing is ready)."""
        config = self.config
        self.signals.install()
        logger.info(
            "worker %s starting: queues=%s concurrency=%d lease=%.1fs %s",
            self.worker_id,
            ",".join(config.queues),
            config.concurrency,
            config.lease_seconds,
            "listen+poll" if config.listen else "poll-only",
        )
        self.slots.start()
        self.reporter.start()
        if config.listen:
            Listener(
                database=config.database,
                dsn=config.listener_dsn,
                queues=frozenset(config.queues),
                wake=self.wake.set,
                stopping=self.stopping,
            ).start()
        try:
            self.control_loop()
            shutdown.drain(self)
            self.deregister()
        finally:
            self.slots.stop()
            self.reporter.stop()
            self.connection.drop()
        logger.info(
            "worker %s stopped: %s", self.worker_id, dict(sorted(self.stats.counts.items()))
        )
        return EXIT_OK

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def deregister(self) -> None:
        """A clean exit: mark this worker's registry row stopped (lost rows say otherwise)."""
        try:
            with self.connection.get().cursor() as cur:
                self.registry.stop(cur)
        except psycopg.Error as exc:
            logger.warning("could not mark the worker stopped (%s); it will show as lost", exc)

    def on_outcome(self, outcome: Outcome) -> None:
        """Called from a slot thread: queue the outcome and wake the control loop."""
        self.leases.report(outcome)
        self.wake.set()

    # -- the control loop ----------------------------------------------------

    def control_loop(self) -> None:
        reconnect = Ladder(WORKER_RECONNECT_SECONDS)
        while not self.stopping.is_set():
            self.wake.clear()  # Wake-ups during this pass keep the next wait short.
            try:
                claimed = self.one_pass()
                reconnect.reset()
            except Exception as exc:  # The loop logs and carries on.
                delay = reconnect.next_delay()
                if isinstance(exc, psycopg.OperationalError):
                    logger.warning("database unavailable (%s); reconnecting in %.1fs", exc, delay)
                else:
                    logger.exception("control loop error; retrying in %.1fs", delay)
                self.connection.drop()  # Pending outcomes are written again, fenced.
                self.stopping.wait(delay)
                continue
            if self.options.max_jobs and self.leases.finished_attempts >= self.options.max_jobs:
                logger.info("max jobs reached (%d): stopping", self.leases.finished_attempts)
                self.stop()
                break
            if claimed:
                continue  # There may be more ready work: claim again before sleeping.
            if self.options.burst and self.idle():
                logger.info("burst: nothing ready and nothing held, exiting")
                break
            self.wake.wait(self.sleep_seconds())

    def one_pass(self) -> int:
        """Run the services that are due, then one cycle; returns how many jobs it claimed."""
        self.schedule.run_due(self.connection.get(), Now.read())
        if self.instrument:
            self.instrument.leases_counted(
                held=len(self.leases.held), in_flight=self.slots.running()
            )
        return self.cycle()

    def cycle(self, *, claim: bool = True) -> int:
        """Write pending outcomes and claim new work in one transaction: one commit."""
        leases = self.leases
        leases.collect()
        now = time.monotonic()
        steps = (
            self.claimer.plan(
                running=self.slots.running(),
                waiting=self.slots.waiting(),
                avg_duration=self.slots.avg_duration,
                holds_isolated=leases.holds_isolated(),
                now=now,
            )
            if claim and not self.stopping.is_set()
            else []
        )
        if not leases.pending and not steps:
            return 0
        conn = self.connection.get()
        # One statement is its own transaction in autocommit: skip BEGIN and
        # COMMIT round trips (an idle worker's claim is the latency path). A
        # step that runs only after a claim that found nothing needs no
        # transaction around the two.
        statements = leases.statements() + sum(not s.if_none_claimed for s in steps)
        try:
            with (
                conn.transaction() if statements > 1 else contextlib.nullcontext(),
                conn.cursor() as cur,
            ):
                written = leases.write(cur)
                claimed = self.claimer.claim(cur, steps, now)
        except Exception as exc:
            if not leases.pending or not outcomes.refused_value(exc) or conn.closed:
                raise  # The loop logs it, reconnects if need be, and tries again.
            # Rolled back, claim included. Isolate the row PostgreSQL refused:
            # each outcome in a savepoint, then the claim, in one transaction.
            logger.warning(
                "a batch of %d outcome(s) was refused (%s); writing them one by one",
                len(leases.pending),
                exc,
            )
            with conn.transaction(), conn.cursor() as cur:
                written = leases.write_each(cur, conn.transaction)
                claimed = self.claimer.claim(cur, steps, now)
        for outcome in leases.settle(written):
            self.reporter.submit(outcome)
        for held in leases.take(claimed):
            self.slots.submit(held)
        return len(claimed)

    def idle(self) -> bool:
        """Nothing held, nothing running, nothing left to write.

        A handler abandoned after its timeout does not count: its lease is gone.
        """
        return self.leases.idle() and not self.slots.running()

    def sleep_seconds(self) -> float:
        """Until the poll interval passes or the next service is due."""
        return min(
            self.config.poll_seconds, max(self.schedule.earliest_due() - time.monotonic(), 0.0)
        )
