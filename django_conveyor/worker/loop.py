"""One worker process: a control loop that schedules services and runs cycles.

The control loop owns the worker's database connection and does all of its
protocol traffic. Each pass:

1. runs the maintenance services that are due: the heartbeat, the reaper,
   the timeouts, the registry, the cron scheduler and the vacuum (services/; base.py
   says what a service is, and `Timetable` runs the due ones);
2. runs one cycle: write every pending outcome and claim new work, in one
   transaction (holdings.py holds the attempts and their outcomes,
   outcomes.py writes them, claims.py sizes and runs the claim);
3. sleeps until a NOTIFY (`Listener`, connections.py) or a finished handler
   wakes it, a service is due, or the poll interval passes.

Handlers run in slot threads (handlers/). Signals are in shutdown.py, which
also says what a graceful stop does; the drain and the hand-back are this
loop's own (`Worker.drain`, `Worker.hand_back`). Its options are in
config.py; `--processes` is supervisor.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import psycopg

from .. import protocol
from ..conf import conveyor_settings
from ..observability import joblogs
from . import outcomes
from .attempts import COMPLETE, RELEASE, Attempt, Outcome
from .backoff import WORKER_RECONNECT_SECONDS, Ladder
from .claims import Claimer
from .config import WorkerConfig, WorkerOptions
from .connections import READ_ONLY, Listener, LoopConnection, is_read_only, one_line
from .cycles import Cycle, CycleResult
from .handlers.reporting import Reporter
from .handlers.slots import STALL_SECONDS, SlotPool
from .holdings import Holdings
from .instrument import Counters, log_job
from .preflight import BURST_GIVE_UP_SECONDS, first_line
from .services.base import Now, Service, Timetable
from .services.claim_order import ClaimOrderService
from .services.gates import GatesService
from .services.heartbeat import Heartbeat
from .services.limits import LimitsService
from .services.reaper import Reaper
from .services.registry import Registry, WorkerInfo
from .services.scheduler import SchedulerService
from .services.timeouts import Timeouts
from .services.vacuum import VacuumService
from .shutdown import StopSignals, exit_process
from .starts import StartPlan, StartWindow

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_UNAVAILABLE = 1  # A --burst worker whose passes failed for BURST_GIVE_UP_SECONDS.
DRAIN_PASS_SECONDS = 0.05  # How often the drain looks for finished handlers.
DRAIN_RETRY_SECONDS = 0.2  # Pause after a database error while draining.


class Worker:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.config = config = WorkerConfig.resolve(options)
        self.worker_id = config.worker_id
        self.counters = Counters()
        self.instrument = options.instrument  # None: no event is even called.
        self.holdings = Holdings(
            config.worker_id,
            config.database,
            self.counters,
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
        self.starts = StartWindow(config.worker_id)  # What the slots may start (starts.py).
        self.heartbeat = Heartbeat(
            self.holdings, lease_seconds=config.lease_seconds, interval=config.heartbeat_seconds
        )
        self.registry = Registry(
            WorkerInfo(id=config.worker_id, queues=config.queues, concurrency=config.concurrency),
            leases_held=lambda: len(self.holdings.held),
            interval=config.heartbeat_seconds,
        )
        self.vacuum = (
            None
            if config.vacuum_dead_rows is None
            else VacuumService(database=config.database, dead_rows=config.vacuum_dead_rows)
        )
        self.timetable = Timetable(self.services(), self.counters)
        # A listener DSN or poll-only mode means the main DSN may be a pooler.
        self.connection = LoopConnection(
            config.database, prepare=config.listen and not config.listener_dsn
        )
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.signals = StopSignals(
            self.stop, options.stop_signals, repeat_is_hard=not options.supervised
        )
        self.exit_code = EXIT_OK
        self.statement_cancelled = False  # The statement_timeout cause was named this streak.

    def services(self) -> list[Service]:
        """The maintenance services the control loop schedules, in the order a pass runs them."""
        # One queue's claim reads its own range already: no claim order to look at.
        several = len(self.config.queues) > 1
        services: list[Service] = [
            self.heartbeat,
            LimitsService(self.config.queues, self.claimer.route, database=self.config.database),
            *([ClaimOrderService(self.claimer)] if several else []),
            Reaper(interval=self.config.reap_seconds),
            GatesService(database=self.config.database, interval=self.config.gates_seconds),
            Timeouts(
                self.holdings, abandon=self.slots.abandon, running=self.slots.running_attempts
            ),
            self.registry,
        ]
        if self.options.cron:
            services.append(SchedulerService(database=self.config.database))
        if self.vacuum is not None:
            services.append(self.vacuum)
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
        joblogs.install(conveyor_settings().JOB_LOG_LEVEL)
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
            self.drain()
            self.deregister()
        finally:
            if self.vacuum is not None:
                self.vacuum.stop()
            self.slots.stop()
            self.reporter.stop()
            self.connection.drop()
            joblogs.uninstall()
        logger.info(
            "worker %s stopped: %s", self.worker_id, dict(sorted(self.counters.counts.items()))
        )
        return self.exit_code

    def run_to_exit(self) -> int:
        """Run this process's worker; past stuck handler threads, end the process now."""
        code = self.run()
        if handlers := self.slots.in_handlers():
            exit_process(code, handlers)
        return code

    def stop(self) -> None:
        """The first stop signal: stop claiming; `run` then drains (shutdown.py says how)."""
        self.stopping.set()
        self.wake.set()

    def drain(self) -> None:
        """Hand back what has not started, wait for the rest, hand back leftovers."""
        self.hand_back(self.slots.take_waiting() + self.starts.take_all(), reason="never started")
        deadline = time.monotonic() + self.config.shutdown_timeout
        while self.holdings.held and time.monotonic() < deadline:
            try:
                self.timetable.run_due(self.connection.get(), Now.read(), draining=True)
                self.cycle(claim=False)
            except psycopg.Error as exc:
                logger.warning("database unavailable during shutdown (%s)", exc)
                self.connection.drop()
                time.sleep(DRAIN_RETRY_SECONDS)
            self.wake.wait(DRAIN_PASS_SECONDS)
            self.wake.clear()
        self.hand_back(list(self.holdings.held.values()), reason="shutdown timeout reached")

    def hand_back(self, attempts: list[Attempt], *, reason: str) -> None:
        """Write RELEASE for these leases now (with any other pending outcome)."""
        self.holdings.collect()  # A handler that just finished keeps its own outcome.
        for attempt in attempts:
            # A job inside its guarded block holds its row lock: handing it back
            # would wait for the block. It commits, or rolls back and is reaped.
            if attempt.in_atomic or attempt.completed_in_atomic:
                continue
            if self.holdings.give_up(attempt, Outcome(RELEASE, attempt), f"handed back: {reason}"):
                log_job(logger, logging.INFO, attempt.lease, "lease handed back (%s)", reason)
        try:
            self.cycle(claim=False)
        except psycopg.Error as exc:
            self.connection.drop()
            logger.warning("could not hand back leases (%s): they will expire and be reaped", exc)

    def deregister(self) -> None:
        """A clean exit: mark this worker's registry row stopped (lost rows say otherwise)."""
        try:
            with self.connection.get().cursor() as cur:
                self.registry.stop(cur)
        except psycopg.Error as exc:
            logger.warning("could not mark the worker stopped (%s); it will show as lost", exc)

    def on_outcome(self, outcome: Outcome) -> None:
        """Called from a slot thread: queue the outcome and wake the control loop."""
        self.holdings.report(outcome)
        # Set already: the loop has not cleared it since, so it collects this outcome too.
        if not self.wake.is_set():
            self.wake.set()

    # -- the control loop ----------------------------------------------------

    def control_loop(self) -> None:
        reconnect = Ladder(WORKER_RECONNECT_SECONDS)
        failing_since: float | None = None  # time.monotonic() of the first failed pass in a row.
        while not self.stopping.is_set():
            self.wake.clear()  # Wake-ups during this pass keep the next wait short.
            # A pass that starts holding nothing plans a claim that looks everywhere,
            # isolated jobs included; one that settles the last job it held may not.
            idle_before = self.options.burst and self.idle()
            try:
                claimed = self.one_pass()
                reconnect.reset()
                failing_since = None
                self.statement_cancelled = False  # A later streak is named again.
            except Exception as exc:  # The loop logs and carries on.
                delay = reconnect.next_delay()
                self.log_failure(exc, delay)
                self.connection.drop()  # Pending outcomes are written again, fenced.
                failing_since = failing_since or time.monotonic()
                if self.options.burst and time.monotonic() - failing_since >= BURST_GIVE_UP_SECONDS:
                    logger.error(
                        "burst: every pass failed for %.0fs (last: %s); giving up",
                        BURST_GIVE_UP_SECONDS,
                        first_line(exc),
                    )
                    self.exit_code = EXIT_UNAVAILABLE
                    break
                self.stopping.wait(delay)
                continue
            if self.options.max_jobs and self.holdings.finished_attempts >= self.options.max_jobs:
                logger.info("max jobs reached (%d): stopping", self.holdings.finished_attempts)
                self.stop()
                break
            if claimed:
                continue  # There may be more ready work: claim again before sleeping.
            if self.options.burst and self.idle() and not self.waits_on_limits():
                if not idle_before:
                    continue  # Held jobs until this pass: look everywhere once more.
                logger.info("burst: nothing ready and nothing held, exiting")
                break
            self.wake.wait(self.sleep_seconds())

    def waits_on_limits(self) -> bool:
        """Jobs of a limited queue are ready but wait for room: a burst worker stays."""
        if not self.claimer.limited:
            return False
        with self.connection.get().cursor() as cur:
            return protocol.ready_limited(cur, queues=self.claimer.limited)

    def log_failure(self, exc: Exception, delay: float) -> None:
        """Say why a pass failed: the real cause once a streak, then a short line per repeat."""
        if isinstance(exc, psycopg.errors.QueryCanceled):
            # 57014 is the server's statement_timeout (a role's, a database's), not an
            # outage: reconnecting cannot help, a longer timeout for this role can.
            if self.statement_cancelled:
                logger.warning(
                    "a statement was cancelled again by statement_timeout; retrying in %.1fs",
                    delay,
                )
                return
            self.statement_cancelled = True
            logger.error(
                "a statement was cancelled by statement_timeout (SQLSTATE 57014 query_canceled: "
                "%s); the timeout set for this role or database (statement_timeout = %s) is "
                "shorter than the worker's statements take. Raise it for the worker's role "
                "(ALTER ROLE ... SET statement_timeout = '30s'), or set it for the worker's "
                "connections (OPTIONS 'options': '-c statement_timeout=0'). Retrying in %.1fs",
                first_line(exc),
                self.statement_timeout(),
                delay,
            )
            return
        if is_read_only(exc):
            logger.warning("%s: reconnecting in %.1fs", READ_ONLY, delay)
        elif isinstance(exc, psycopg.OperationalError):
            logger.warning("database unavailable (%s); reconnecting in %.1fs", one_line(exc), delay)
        else:
            logger.exception("control loop error; retrying in %.1fs", delay)

    def statement_timeout(self) -> str:
        """The session's statement_timeout as the server reports it, or '?'."""
        try:
            with self.connection.get().cursor() as cur:
                cur.execute("SHOW statement_timeout")
                return str(cur.fetchone()[0])  # type: ignore[index]
        except psycopg.Error:
            return "?"

    def one_pass(self) -> int:
        """Run the services that are due, then one cycle; returns how many jobs it claimed."""
        now = Now.read()
        self.slots.keep_up(now.monotonic)  # A slot stuck in a short job: wake another.
        self.timetable.run_due(self.connection.get(), now)
        if self.instrument:
            self.instrument.leases_counted(
                held=len(self.holdings.held), in_flight=self.slots.running()
            )
        return self.cycle()

    # -- the cycle (cycles.py) -----------------------------------------------

    def cycle(self, *, claim: bool = True) -> int:
        """Write pending outcomes, claim new work and list what may start: one commit."""
        cycle = self.prepare(claim=claim)
        if cycle is None:
            return 0
        try:
            result: CycleResult | BaseException = self.execute(cycle, self.connection.get())
        except Exception as exc:
            result = exc
        return self.finish(cycle, result)

    def prepare(self, *, claim: bool = True) -> Cycle | None:
        """Take the pending outcomes and plan the claim; None: nothing to do."""
        leases = self.holdings
        leases.collect()
        now = time.monotonic()
        running, queued = self.slots.running(), self.slots.waiting()
        window = self.claimer.start_window(self.slots.avg_duration)
        room = max(0, self.claimer.concurrency - running) + window - queued
        steps = (
            self.claimer.plan(
                running=running,
                waiting=queued + self.starts.waiting(),
                avg_duration=self.slots.avg_duration,
                holds_isolated=leases.holds_isolated(),
                now=now,
                isolated_since=leases.isolated_since(),
            )
            if claim and not self.stopping.is_set()
            else []
        )
        moving = self.starts.moving(room, window)
        if not leases.pending and not steps and not moving:
            return None
        batch = leases.take_pending()
        # One statement is its own transaction in autocommit: skip BEGIN and
        # COMMIT round trips (an idle worker's claim is the latency path). A
        # step that runs only after a claim that found nothing needs no
        # transaction around the two. A list of what may start that a claim
        # turns out to need runs after the claim's commit then: until the
        # list is written, every claimed job counts as started.
        statements = (
            outcomes.statements(batch.values())
            + self.claimer.statements(steps)
            + (self.starts.statements() if moving else 0)
        )
        # No list is written while it is NULL and the claim fits the slots' queue.
        lists = moving or not self.starts.idle() or sum(step.limit for step in steps) > max(room, 0)
        return Cycle(
            batch=batch,
            steps=steps,
            now=now,
            room=room,
            window=window,
            statements=statements,
            lists=lists,
            pipelined=(
                statements > 1
                and not lists
                and not self.claimer.limited
                and len(steps) <= 1
                and not any(step.if_none_claimed or step.isolated for step in steps)
                and all(outcome.kind == COMPLETE for outcome in batch.values())
            ),
        )

    def execute(self, cycle: Cycle, conn: psycopg.Connection) -> CycleResult:
        """Write the cycle's outcomes, claim, list what may start: one commit.

        Changes nothing of the worker's but the reserve's lost front
        (starts.py): `finish` applies the result.
        """
        leases = self.holdings
        try:
            if cycle.pipelined:
                return self.execute_pipelined(cycle, conn)
            with (
                conn.transaction() if cycle.statements > 1 else contextlib.nullcontext(),
                conn.cursor() as cur,
            ):
                written = leases.write(cur, cycle.batch)
                claimed, plan = self.claim_and_list(cur, cycle)
            return CycleResult(written, claimed, plan)
        except Exception as exc:
            if not cycle.batch or not outcomes.refused_value(exc) or conn.closed:
                raise  # The loop logs it, reconnects if need be, and tries again.
            # Rolled back, claim included. Isolate the row PostgreSQL refused:
            # each outcome in a savepoint, then the claim, in one transaction.
            logger.warning(
                "a batch of %d outcome(s) was refused (%s); writing them one by one",
                len(cycle.batch),
                exc,
            )
            with conn.transaction(), conn.cursor() as cur:
                each = leases.write_each(cur, cycle.batch, conn.transaction)
                claimed, plan = self.claim_and_list(cur, cycle)
            return CycleResult(each.written, claimed, plan, each)

    def execute_pipelined(self, cycle: Cycle, conn: psycopg.Connection) -> CycleResult:
        """The common cycle, completions and one plain claim, in two round trips, not four.

        BEGIN, COMPLETE and CLAIM go out together (psycopg's pipeline mode);
        the completions are then read (a refused one is cancelled, and the
        attempts' logs written, as `outcomes.write` does, in the same
        transaction), and COMMIT goes out with whatever that needed.
        """
        batch = list(cycle.batch.values())
        done_cur, claim_cur = conn.cursor(), conn.cursor()
        with conn.pipeline() as pipe, conn.transaction():
            sent = outcomes.send_completions(done_cur, self.worker_id, batch)
            if cycle.steps:
                self.claimer.send(claim_cur, cycle.steps[0])
            pipe.sync()
            written = outcomes.completions_written(done_cur, self.worker_id, batch) if sent else {}
            claimed = self.claimer.received(claim_cur) if cycle.steps else []
        return CycleResult(written, claimed, StartPlan())

    def claim_and_list(
        self, cur: protocol.Cursor, cycle: Cycle
    ) -> tuple[list[protocol.Lease], StartPlan]:
        """The claim steps, then the list of what the slots may start (starts.py)."""
        claimed = self.claimer.claim(cur, cycle.steps, cycle.now)
        if not cycle.lists:
            return claimed, StartPlan()  # Everything starts: the NULL list already says so.
        plan = self.starts.plan(
            cur, claimed, held=self.holdings.unsettled, room=cycle.room, window=cycle.window
        )
        return claimed, plan

    def finish(self, cycle: Cycle, result: CycleResult | BaseException) -> int:
        """Settle and report what the cycle wrote, hand what it claimed to the slots.

        A cycle that failed wrote nothing: its outcomes are pending again, and
        its error goes up to the control loop, which logs it and tries again.
        """
        leases = self.holdings
        if isinstance(result, BaseException):
            leases.restore(cycle.batch)
            if cycle.lists:
                self.starts.failed()
            raise result
        if result.each is not None:
            leases.replace_refused(cycle.batch, result.each)
        self.reporter.submit(leases.settle(cycle.batch, result.written))
        start, lost = self.starts.apply(result.plan, leases.take(result.claimed))
        for attempt in lost:
            leases.lose(attempt, "reaped before it started")
        if lost:
            self.counters.add("leases_lost", len(lost))
        self.slots.submit(start)
        return len(result.claimed)

    def idle(self) -> bool:
        """Nothing attempt, nothing running, nothing left to write.

        A handler abandoned after its timeout does not count: its lease is gone.
        """
        return self.holdings.idle() and not self.slots.running()

    def sleep_seconds(self) -> float:
        """Until the poll interval passes or the next service is due (or, while jobs
        wait for a slot, a stalled slot should be replaced: slots.STALL_SECONDS)."""
        seconds = min(
            self.config.poll_seconds, max(self.timetable.earliest_due() - time.monotonic(), 0.0)
        )
        return min(seconds, STALL_SECONDS) if self.slots.waiting() else seconds
