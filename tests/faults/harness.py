"""The fault run: a private PostgreSQL, real workers, injectors, then the verdict."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from django_conveyor import embedded
from tests.pgbouncer.bouncer import (
    PgBouncer,
    Upstream,
    is_session_state_error,
    session_state_errors,
)

from . import gates, hosts, latency, limits, pg, poison, verify
from .hosts import Host, Network
from .injectors import Injector, Kill9, Partition, PgRestart, SigStop, SigStopInAtomic
from .proxy import FaultProxy
from .workers import WorkerHost, WorkerPool

logger = logging.getLogger("faults")

SCENARIOS = ("kill9", "sigstop", "pg-restart", "network")
# Not part of "all": a worker frozen inside context.atomic() and never continued
# (until the end), which only the bound on the guarded transaction resolves.
ATOMIC = "sigstop-atomic"
ATOMIC_INSIDE_SECONDS = (0.3, 1.2)  # Its default --inside: long enough to be caught there.
POISON = "poison"  # Its faults are the jobs themselves (poison.py), not an injector.
GATES = "gates"  # Workflows that wait for signals (gates.py), under kill -9 and restarts.
# Workers on --hosts hosts: a partition of one host, and the latency measurement.
PARTITION = "partition"
LATENCY = "latency"
# Jobs on limited queues (limits.py) under kill -9, SIGSTOP and restarts, a sampler
# watching their running rows; the three faults together, each this many times rarer.
LIMITS = "limits"
LIMITS_FAULTS = ("kill9", "sigstop", "pg-restart")
LIMITS_PACE = 2.0
HOSTS_DEFAULT = 3
HOST_LATENCY_MS = (2.0,)  # Added round trip between each worker host and the database host.
LATENCY_SCENARIO_MS = (0.0, 2.0, 10.0)
POOLER_MODES = ("poll-only", "listener-dsn")
WORK_SECONDS = (0.1, 1.0)  # Default --work.
LATENCY_SECONDS = 0.030
DROP_RATE = 0.05
FAULT_WINDOW = 0.7  # Faults stop at this fraction of the deadline, to let the rest settle.
MONITOR_SECONDS = 0.5
ALL_PACE = 3.0  # Together, each fault strikes this many times less often.
# A fault run's workflow: a, then b and c side by side, then d after both, then e.
WORKFLOW_SHAPE = {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c"), "e": ("d",)}
WORKFLOW_STEPS = len(WORKFLOW_SHAPE)

# Poisoned jobs that wait at the delay cap are checked by poison.check instead.
NOT_FINAL = """
SELECT count(*) FROM conveyor_job WHERE state <> ALL(%(final)s) AND id <> ALL(%(parked)s)
"""
CONTROL_LOOP_ERROR = "control loop error"
ONE_BY_ONE = "writing them one by one"
TRACEBACKS = "SELECT id, e->>'traceback' FROM conveyor_job, jsonb_array_elements(errors) AS e"


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    scenario: str
    jobs: int
    workers: int
    concurrency: int
    seed: int
    work_seconds: tuple[float, float]  # Handler sleep before its guarded transaction.
    inside_seconds: tuple[float, float]  # Handler sleep inside it (holding the row lock).
    timeout: float
    out: Path
    keep: Path | None
    pgbouncer: str | None  # Workers behind PgBouncer: "poll-only" or "listener-dsn".
    workflows: int = 0  # Five-step workflows instead of single jobs (jobs = 5 x workflows).
    hosts: int = 0  # Worker hosts (network namespaces); 0 runs everything on this host.
    host_latency_ms: tuple[float, ...] = HOST_LATENCY_MS
    fault_seconds: float | None = None  # Faults stop then; None: at FAULT_WINDOW of the deadline.

    @property
    def fault_until(self) -> float:
        """Seconds after the workers' start when the injectors stop."""
        if self.fault_seconds is not None:
            return min(self.fault_seconds, self.timeout)
        return self.timeout * FAULT_WINDOW

    @property
    def faults(self) -> tuple[str, ...]:
        if self.scenario in (POISON, LATENCY):
            return ()
        if self.scenario == GATES:
            return ("kill9", "pg-restart")
        if self.scenario == LIMITS:
            return LIMITS_FAULTS
        return SCENARIOS if self.scenario == "all" else (self.scenario,)


def parse_args(argv: list[str] | None) -> Params:
    parser = argparse.ArgumentParser(description="Run a fault-injection scenario.")
    parser.add_argument(
        "--scenario",
        required=True,
        choices=[*SCENARIOS, ATOMIC, "all", POISON, PARTITION, LATENCY, GATES, LIMITS],
    )
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--out", type=Path, required=True, help="Folder for fault-NAME.json.")
    parser.add_argument("--workers", type=int, default=3, help="Worker processes (default 3).")
    parser.add_argument("--concurrency", type=int, default=2, help="Slots per worker (default 2).")
    parser.add_argument("--seed", type=int, default=None, help="Seed for jobs and faults.")
    parser.add_argument(
        "--work",
        type=float,
        nargs=2,
        default=None,
        metavar=("MIN", "MAX"),
        help=f"Default {WORK_SECONDS[0]:g} {WORK_SECONDS[1]:g} ({LATENCY}: 0 0).",
    )
    parser.add_argument(
        "--inside", type=float, nargs=2, default=None, metavar=("MIN", "MAX"),
        help=f"Default 0 0.05 ({ATOMIC}: {ATOMIC_INSIDE_SECONDS[0]} {ATOMIC_INSIDE_SECONDS[1]}).",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=None, help="Deadline in seconds.")
    parser.add_argument(
        "--fault-seconds",
        type=float,
        default=None,
        help=f"Stop injecting after this many seconds (default {FAULT_WINDOW:g} of the deadline); "
        "the deadline then only bounds how long the rest may take to settle.",
    )
    parser.add_argument("--keep", type=Path, default=None, help="Copy worker logs here.")
    parser.add_argument(
        "--pgbouncer",
        choices=POOLER_MODES,
        default=None,
        help="Put the workers behind a PgBouncer in transaction mode, polling only "
        "(--poll-only) or listening on a direct connection (LISTENER_DSN).",
    )
    parser.add_argument(
        "--workflows",
        type=int,
        default=0,
        metavar="N",
        help="Enqueue N five-step workflows (5 N jobs) instead of --jobs single jobs.",
    )
    parser.add_argument(
        "--hosts",
        type=int,
        default=None,
        metavar="N",
        help=f"Run the workers on N hosts (network namespaces; root only) that reach the "
        f"database host over a link with added latency (default 0; {HOSTS_DEFAULT} for "
        f"{PARTITION} and {LATENCY}).",
    )
    parser.add_argument(
        "--host-latency-ms",
        type=float,
        nargs="+",
        default=None,
        metavar="MS",
        help=f"Added round trip to the database host (default {HOST_LATENCY_MS[0]:g}; "
        f"{LATENCY}: each of {' '.join(f'{x:g}' for x in LATENCY_SCENARIO_MS)} in turn).",
    )
    args = parser.parse_args(argv)
    if args.hosts is None:
        args.hosts = HOSTS_DEFAULT if args.scenario in (PARTITION, LATENCY) else 0
    if args.host_latency_ms is None:
        args.host_latency_ms = LATENCY_SCENARIO_MS if args.scenario == LATENCY else HOST_LATENCY_MS
    if args.scenario in (PARTITION, LATENCY) and args.hosts < 2:
        parser.error(f"--scenario {args.scenario} needs --hosts 2 or more.")
    if any(not 0 <= ms <= 1000 for ms in args.host_latency_ms) or args.hosts < 0:
        parser.error("--host-latency-ms takes 0 to 1000 ms, --hosts 0 or more.")
    if args.scenario != LATENCY and len(args.host_latency_ms) > 1:
        parser.error(f"Several --host-latency-ms values are for --scenario {LATENCY} only.")
    if args.scenario == LATENCY and (args.workflows or args.pgbouncer):
        parser.error(f"--scenario {LATENCY} takes neither --workflows nor --pgbouncer.")
    if args.scenario == LIMITS and args.workflows:
        parser.error(f"--scenario {LIMITS} enqueues single jobs: it takes no --workflows.")
    if args.hosts and args.pgbouncer:
        parser.error("--hosts and --pgbouncer do not go together.")
    if args.hosts:
        try:
            hosts.require()
        except hosts.HostsUnavailable as exc:
            parser.error(str(exc))
    if args.work is None:  # The latency scenario measures the queue, not the handler's sleep.
        args.work = (0.0, 0.0) if args.scenario == LATENCY else WORK_SECONDS
    if args.scenario == GATES:  # Three jobs per workflow: a, its gate, b.
        args.workflows = args.workflows or max(1, args.jobs // len(gates.SHAPE))
        args.jobs = len(gates.SHAPE) * args.workflows
    elif args.workflows:
        args.jobs = WORKFLOW_STEPS * args.workflows
    if args.fault_seconds is not None and not args.fault_seconds > 0:
        parser.error("--fault-seconds must be above 0.")
    if args.jobs < 1 or args.workers < 2 or args.concurrency < 1:
        parser.error("--jobs and --concurrency must be 1 or more, --workers 2 or more.")
    if args.inside is None:
        args.inside = ATOMIC_INSIDE_SECONDS if args.scenario == ATOMIC else (0.0, 0.05)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    slots = args.workers * args.concurrency
    timeout = args.timeout or 60 + 4 * args.jobs * sum(args.work) / 2 / slots
    return Params(
        scenario=args.scenario,
        jobs=args.jobs,
        workers=args.workers,
        concurrency=args.concurrency,
        seed=seed,
        work_seconds=tuple(args.work),
        inside_seconds=tuple(args.inside),
        timeout=timeout,
        out=args.out,
        keep=args.keep,
        pgbouncer=args.pgbouncer,
        workflows=args.workflows,
        hosts=args.hosts,
        host_latency_ms=tuple(args.host_latency_ms),
        fault_seconds=args.fault_seconds,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s faults %(message)s")
    params = parse_args(argv)
    os.environ.pop("DATABASE_URL", None)  # The harness needs a server it can crash.
    signal.signal(signal.SIGTERM, _interrupt)
    work = Path(tempfile.mkdtemp(prefix="conveyor-faults-"))
    run = Run(params, work)
    try:
        result = run.execute()
    finally:
        run.tear_down()
        if params.keep:
            params.keep.mkdir(parents=True, exist_ok=True)
            for log in [*(work / "logs").glob("*.log"), *(work / "pgbouncer").glob("*.log")]:
                shutil.copy(log, params.keep / log.name)
        shutil.rmtree(work, ignore_errors=True)
    params.out.mkdir(parents=True, exist_ok=True)
    workflows = params.workflows and params.scenario != GATES
    name = f"{params.scenario}-workflows" if workflows else params.scenario
    path = params.out / f"fault-{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    summary = {
        k: result[k]
        for k in (
            "completed",
            "lost",
            "duplicate_effects",
            "stale_outcomes_rejected",
            "fencing_violations",
            *(limits.HEADLINE if params.scenario == LIMITS else ()),
        )
    }
    logger.info("%s: %s in %.1fs -> %s", params.scenario, summary, result["duration_s"], path)
    for failure in result["failures"]:
        logger.error("FAIL: %s", failure)
    return 0 if result["passed"] else 1


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Run:
    def __init__(self, params: Params, work: Path) -> None:
        self.params = params
        self.work = work
        self.rng = random.Random(params.seed)
        self.data_dir = work / "pgdata"
        self.log_dir = work / "logs"
        self.log_dir.mkdir()
        self.pg_port = pg.free_port()
        self.proxy: FaultProxy | None = None
        self.bouncer: PgBouncer | None = None
        self.pool: WorkerPool | None = None
        self.injectors: list[Injector] = []
        self.stop_faults = threading.Event()
        self.pg_started = False
        self.respawned = 0
        self.progress: list[tuple[float, int]] = []  # (seconds, jobs final)
        self.poisoned: dict[int, str] = {}  # Job id -> poison kind (scenario poison).
        self.network: Network | None = None  # --hosts: the database host and worker hosts.
        self.db_host: Host | None = None
        self.worker_hosts: list[Host] = []
        self.relays: list[FaultProxy] = []  # One per worker host, on the database host.
        self.netem_error: str | None = None
        self.latency_figures: list[dict[str, Any]] = []
        self.sampler: limits.Sampler | None = None  # Scenario limits: the running-rows watch.

    def execute(self) -> dict[str, Any]:
        p = self.params
        logger.info(
            "%s: %d jobs, %d workers x %d, seed %d, deadline %.0fs",
            p.scenario,
            p.jobs,
            p.workers,
            p.concurrency,
            p.seed,
            p.timeout,
        )
        if p.hosts:
            self.open_network()  # First: the server runs on the database host.
        self.pg_started = True  # Set first: a start that fails halfway is stopped too.
        pg.start(self.data_dir, self.pg_port)
        self.migrate()
        if p.scenario != LATENCY:
            self.enqueue()
        worker_port = self.pg_port
        if p.pgbouncer:
            upstream = Upstream("127.0.0.1", self.pg_port, embedded.SUPERUSER, None)
            self.bouncer = PgBouncer(self.work / "pgbouncer", upstream).start()
            worker_port = self.bouncer.port
        if "network" in p.faults and not p.hosts:  # With hosts, their relays drop too.
            upstream_port, worker_port = worker_port, pg.free_port()
            self.proxy = FaultProxy(
                listen_port=worker_port,
                upstream_port=upstream_port,
                latency=LATENCY_SECONDS,
                drop_rate=DROP_RATE,
                seed=self.rng.randrange(2**31),
            )
            self.proxy.start()
        setup = self.pooler_setup()
        if p.scenario == POISON:
            setup["extra_env"] = {**setup.get("extra_env", {}), **poison.WORKER_ENV}
        from .settings import QUEUE  # Imported once migrate() set the server's port.

        self.pool = WorkerPool(
            queue=",".join(sorted(limits.declared())) if p.scenario == LIMITS else QUEUE,
            count=p.workers,
            concurrency=p.concurrency,
            db_port=worker_port,
            log_dir=self.log_dir,
            hosts=self.start_relays(worker_port) if p.hosts else (),
            **setup,
        )
        if p.scenario == LIMITS:  # Watching before the first claim.
            self.sampler = limits.Sampler(self.pg_port, threading.Event())
            self.sampler.start()
        started = time.monotonic()
        self.pool.start_all()
        total = p.jobs
        signaller = None
        if p.scenario == LATENCY:
            self.latency_figures, total = latency.measure(
                port=self.pg_port,
                latencies_ms=p.host_latency_ms,
                set_latency=self.set_latency,
                enqueue=self.enqueue,
            )
            settled_at: float | None = time.monotonic() - started
        else:
            self.start_injectors()
            if p.scenario == GATES:
                signaller = gates.Signaller(self.pg_port, threading.Event())
                signaller.start()
            settled_at = self.wait_for_final(started)
        self.stop_injectors()
        if signaller is not None:
            signaller.stop.set()
            signaller.join(30)
        if "sigstop" in p.faults or ATOMIC in p.faults:
            # A zombie thawed just now still has handlers asleep: let them wake
            # and report (and be refused) before SIGTERM ends the process.
            time.sleep(p.work_seconds[1] + p.inside_seconds[1] + 1.0)
        self.pool.stop_all()
        if self.proxy:
            self.proxy.stop()
        if self.bouncer:
            self.bouncer.stop()
        duration = time.monotonic() - started
        self.stop_sampler()
        pg.start(self.data_dir, self.pg_port)  # Up again, whatever the injector left.
        facts = verify.read_logs(sorted(self.log_dir.glob("*.log")))
        ordinary = total - len(self.poisoned)
        with pg.connect(self.pg_port) as conn:
            figures = verify.check(conn, ordinary, facts)
            if p.scenario == POISON:
                poisoned, poison_failures = poison.check(conn, self.poisoned)
        if p.workflows and p.scenario != GATES:
            with pg.connect(self.pg_port) as conn:
                figures["workflows"] = verify.check_workflows(conn, p.workflows)
        failed = verify.failures(
            figures, require_stale=p.scenario in ("sigstop", ATOMIC, PARTITION)
        )
        if signaller is not None:
            with pg.connect(self.pg_port) as conn:
                figures["gates"] = gates.check(conn, p.workflows, signaller)
            failed += gates.failures(figures["gates"])
        if self.sampler is not None:
            with pg.connect(self.pg_port) as conn:
                figures.update(limits.check(conn, self.sampler, duration))
            failed += limits.failures(figures)
        if ATOMIC in p.faults:
            with pg.connect(self.pg_port) as conn:
                figures["frozen_inside_atomic"] = verify.frozen_inside_atomic(
                    conn, self.atomic_freezes()
                )
            failed += verify.atomic_failures(figures["frozen_inside_atomic"])
        if p.scenario == POISON:
            figures["lost"] -= len(self.parked())  # Waiting at the cap, as poison.check saw.
            failed = verify.failures(figures, require_stale=False) + poison_failures
            figures["poison"] = {**poisoned, **self.log_counts()}
            if figures["poison"]["control_loop_errors_logged"]:
                failed.append("A worker logged a control loop error: a batch failed.")
            if self.respawned:
                failed.append(f"{self.respawned} worker(s) exited during the run.")
        if self.bouncer:
            logs = [*sorted(self.log_dir.glob("*.log")), self.bouncer.log]
            errors = session_state_errors(logs)  # Handlers' errors are only in the jobs' rows:
            for job_id, traceback in pg.query(self.pg_port, TRACEBACKS) or []:
                if is_session_state_error(traceback):
                    errors.append(f"job {job_id}: {traceback.strip().splitlines()[-1]}")
            figures["pgbouncer"] = {"mode": p.pgbouncer, "session_state_errors": errors[:20]}
            if errors:
                failed.append(f"{len(errors)} session-state error(s) logged, first: {errors[0]}")
        return self.report(figures, failed, duration, settled_at)

    def parked(self) -> list[int]:
        return [i for i, kind in self.poisoned.items() if kind in poison.PARKED]

    def log_counts(self) -> dict[str, int]:
        texts = [log.read_text(errors="replace") for log in self.log_dir.glob("*.log")]
        return {
            "control_loop_errors_logged": sum(t.count(CONTROL_LOOP_ERROR) for t in texts),
            "batches_written_one_by_one": sum(t.count(ONE_BY_ONE) for t in texts),
        }

    def pooler_setup(self) -> dict[str, Any]:
        """The workers' extra flags and environment behind PgBouncer (tests/faults/settings.py)."""
        if self.bouncer is None:
            return {}
        env = {"CONVEYOR_FAULTS_POOLER": "1", "CONVEYOR_FAULTS_PG_PASSWORD": self.bouncer.password}
        if self.params.pgbouncer == "poll-only":
            return {"extra_args": ("--poll-only",), "extra_env": env}
        # The listener goes straight to the server, on the port the injector restarts.
        direct = self.bouncer.upstream.conninfo(dbname=embedded.DATABASE, connect_timeout=3)
        return {"extra_env": {**env, "CONVEYOR_FAULTS_LISTENER_DSN": direct}}

    def migrate(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.faults.settings"
        os.environ["CONVEYOR_FAULTS_PG_PORT"] = str(self.pg_port)
        import django
        from django.core.management import call_command
        from django.db import connections

        django.setup()
        call_command("migrate", verbosity=0)
        connections.close_all()

    def enqueue(self, count: int = 0) -> list[int]:
        """Enqueue `count` jobs (0: the run's --jobs, poisoned ones included); their ids."""
        if self.params.scenario == GATES:
            self.enqueue_gates()
            return []
        if self.params.scenario == LIMITS:
            self.enqueue_limited()
            return []
        if self.params.workflows:
            self.enqueue_workflows()
            return []
        from django_conveyor import protocol

        from .settings import CONVEYOR, QUEUE
        from .tasks import TASK_PATH

        p = self.params
        attempts = int(CONVEYOR["MAX_ATTEMPTS"])
        jobs = [
            protocol.NewJob(
                task_path=TASK_PATH,
                args=[
                    round(self.rng.uniform(*p.work_seconds), 3),
                    round(self.rng.uniform(*p.inside_seconds), 3),
                ],
                kwargs={},
                queue=QUEUE,
                backend="default",
                priority=0,
                max_attempts=attempts,
            )
            for _ in range(count or p.jobs)
        ]
        chosen = poison.choose(self.rng, p.jobs) if p.scenario == POISON and not count else {}
        for position, name in chosen.items():
            kind = poison.KINDS[name]
            jobs[position] = protocol.NewJob(
                kind.task_path, list(kind.args), {}, QUEUE, "default", 0,
                kind.max_attempts or attempts,
            )  # fmt: skip
        with pg.connect(self.pg_port) as conn, conn.transaction(), conn.cursor() as cur:
            rows = protocol.enqueue(cur, jobs, notify=True)
            self.poisoned = {rows[position].id: name for position, name in chosen.items()}
            poison.corrupt(conn, self.poisoned)
        return [row.id for row in rows]

    def open_network(self) -> None:
        """The database host and the worker hosts; this process moves onto the database host."""
        self.network = Network()
        self.db_host = self.network.add("db")
        self.worker_hosts = [self.network.add(f"h{i + 1}") for i in range(self.params.hosts)]
        self.netem_error = self.network.netem_error(self.worker_hosts[0])
        self.network.enter(self.db_host)

    def start_relays(self, upstream_port: int) -> list[WorkerHost]:
        """One relay per worker host, on the database host's address: the added latency."""
        assert self.db_host is not None
        p = self.params
        network = "network" in p.faults
        placed = []
        for host in self.worker_hosts:
            port = pg.free_port()
            relay = FaultProxy(
                listen_host=self.db_host.address,
                listen_port=port,
                upstream_port=upstream_port,
                latency=latency.relay_latency(p.host_latency_ms[0])
                + (LATENCY_SECONDS if network else 0.0),
                drop_rate=DROP_RATE if network else 0.0,
                seed=self.rng.randrange(2**31),
            )
            relay.start()
            self.relays.append(relay)
            env = {
                "CONVEYOR_FAULTS_PG_HOST": self.db_host.address,
                "CONVEYOR_FAULTS_PG_PORT": str(port),
            }
            placed.append(WorkerHost(host.name, tuple(host.command()), env))
        return placed

    def set_latency(self, rtt_ms: float) -> None:
        for relay in self.relays:
            relay.latency = latency.relay_latency(rtt_ms)

    def cut(self, name: str) -> None:
        assert self.network is not None
        self.network.cut(self.network.hosts[name])

    def heal(self, name: str) -> None:
        assert self.network is not None
        self.network.heal(self.network.hosts[name])

    def enqueue_gates(self) -> None:
        from .settings import CONVEYOR, QUEUE

        p = self.params
        with pg.connect(self.pg_port) as conn, conn.transaction(), conn.cursor() as cur:
            gates.enqueue(cur, rng=self.rng, workflows=p.workflows, work=p.work_seconds,
                          queue=QUEUE, attempts=int(CONVEYOR["MAX_ATTEMPTS"]))  # fmt: skip

    def enqueue_limited(self) -> None:
        from .settings import CONVEYOR

        p = self.params
        attempts = int(CONVEYOR["MAX_ATTEMPTS"])
        with pg.connect(self.pg_port) as conn, conn.transaction(), conn.cursor() as cur:
            limits.enqueue(cur, rng=self.rng, jobs=p.jobs, work=p.work_seconds,
                           inside=p.inside_seconds, attempts=attempts)  # fmt: skip

    def enqueue_workflows(self) -> None:
        """Every workflow in one transaction, one ENQUEUE per step name (in dependency order)."""
        from django_conveyor import protocol

        from .settings import CONVEYOR, QUEUE
        from .tasks import STEP_PATH

        p = self.params
        ids: dict[tuple[int, str], int] = {}
        with pg.connect(self.pg_port) as conn, conn.transaction(), conn.cursor() as cur:
            for step, after in WORKFLOW_SHAPE.items():
                jobs = [
                    protocol.NewJob(
                        task_path=STEP_PATH,
                        args=[
                            round(self.rng.uniform(*p.work_seconds), 3),
                            round(self.rng.uniform(*p.inside_seconds), 3),
                        ],
                        kwargs={"workflow": w, "step": step},
                        queue=QUEUE,
                        backend="default",
                        priority=0,
                        max_attempts=int(CONVEYOR["MAX_ATTEMPTS"]),
                        depends_on=tuple(ids[w, a] for a in after),
                    )
                    for w in range(p.workflows)
                ]
                for w, row in enumerate(protocol.enqueue(cur, jobs, notify=True)):
                    ids[w, step] = row.id

    def start_injectors(self) -> None:
        assert self.pool is not None
        from .settings import LEASE_SECONDS

        def rng() -> random.Random:
            return random.Random(self.rng.randrange(2**31))

        pace = {"all": ALL_PACE, LIMITS: LIMITS_PACE}.get(self.params.scenario, 1.0)
        common = {"stop": self.stop_faults, "pace": pace}
        worker = {"pool": self.pool, "db_port": self.pg_port}
        if "kill9" in self.params.faults:
            self.injectors.append(Kill9(rng=rng(), **common, **worker))
        if "sigstop" in self.params.faults:
            self.injectors.append(
                SigStop(rng=rng(), lease_seconds=LEASE_SECONDS, **common, **worker)
            )
        if ATOMIC in self.params.faults:
            from .tasks import IN_ATOMIC

            freezes = min(16, max(3, self.params.jobs // 60))  # Frozen processes pile up.
            self.injectors.append(
                SigStopInAtomic(
                    rng=rng(), prefix=IN_ATOMIC, max_freezes=freezes, **common, **worker
                )
            )
        if PARTITION in self.params.faults:
            self.injectors.append(
                Partition(
                    rng=rng(),
                    lease_seconds=LEASE_SECONDS,
                    cut=self.cut,
                    heal=self.heal,
                    **common,
                    **worker,
                )
            )
        if "pg-restart" in self.params.faults:
            self.injectors.append(
                PgRestart(rng=rng(), data_dir=self.data_dir, port=self.pg_port, **common)
            )
        for injector in self.injectors:
            injector.start()

    def wait_for_final(self, started: float) -> float | None:
        """Until every job is final or the deadline; faults stop at the fault window."""
        assert self.pool is not None
        final = list(verify.FINAL_STATES)
        while (elapsed := time.monotonic() - started) < self.params.timeout:
            if elapsed > self.params.fault_until:
                self.stop_injectors()
            self.respawned += self.pool.respawn_exited()
            rows = pg.query(self.pg_port, NOT_FINAL, {"final": final, "parked": self.parked()})
            if rows is not None:
                self.progress.append((round(elapsed, 1), self.params.jobs - rows[0][0]))
                if rows[0][0] == 0:
                    return elapsed
            time.sleep(MONITOR_SECONDS)
        return None

    def atomic_freezes(self) -> list[dict[str, Any]]:
        return [h for i in self.injectors if isinstance(i, SigStopInAtomic) for h in i.held]

    def stop_injectors(self) -> None:
        self.stop_faults.set()
        for injector in self.injectors:
            injector.join(30)

    def stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop.set()
            self.sampler.join(30)

    def tear_down(self) -> None:
        self.stop_injectors()
        self.stop_sampler()
        if self.pool is not None:
            self.pool.stop_all(grace=10)
        if self.proxy is not None:
            self.proxy.stop()
        if self.bouncer is not None:
            self.bouncer.stop()
        for relay in self.relays:
            relay.stop()
        if self.pg_started:
            pg.stop(self.data_dir)
        if self.network is not None:
            self.network.tear_down()

    def report(
        self, figures: dict[str, Any], failed: list[str], duration: float, settled: float | None
    ) -> dict[str, Any]:
        from django_conveyor.conf import conveyor_settings

        p = self.params
        conf = conveyor_settings()
        faults: dict[str, int] = {}
        for injector in self.injectors:
            faults.update(injector.counts)
            if injector.error is not None:
                failed.append(f"The {injector.name} injector failed: {injector.error!r}")
        if self.proxy is not None:
            faults.update({f"proxy_{k}": v for k, v in self.proxy.counts.items()})
        for relay in self.relays:
            for k, v in relay.counts.items():
                faults[f"relay_{k}"] = faults.get(f"relay_{k}", 0) + v
        assert self.pool is not None
        faults["worker_incarnations"] = len(self.pool.history)
        faults["workers_respawned_after_exit"] = self.respawned
        head = verify.headline(figures)
        if self.sampler is not None:  # Its verdict opens the report too.
            head.update({k: figures.pop(k) for k in limits.HEADLINE})
        return {
            "scenario": p.scenario,
            **head,
            "passed": not failed,
            "failures": failed,
            "duration_s": round(duration, 1),
            "all_final_after_s": None if settled is None else round(settled, 1),
            "parameters": {
                "workers": p.workers,
                "concurrency": p.concurrency,
                "lease_s": conf.LEASE_SECONDS,
                "heartbeat_s": conf.HEARTBEAT_SECONDS,
                "reap_s": conf.REAP_SECONDS,
                "max_attempts": conf.MAX_ATTEMPTS,
                "seed": p.seed,
                "handler_work_s": list(p.work_seconds),
                "handler_inside_transaction_s": list(p.inside_seconds),
                "deadline_s": round(p.timeout, 1),
                "faults_until_s": round(p.fault_until, 1),
                "faults": list(p.faults),
                "network_latency_s": LATENCY_SECONDS if "network" in p.faults else None,
                "network_drop_rate": DROP_RATE if "network" in p.faults else None,
                "pgbouncer": p.pgbouncer,
                "workflows": p.workflows or None,
                "workflow_shape": (
                    {"a": [], "g": ["a"], "b": ["g"]}
                    if p.scenario == GATES
                    else WORKFLOW_SHAPE
                    if p.workflows
                    else None
                ),
                "hosts": self.hosts_parameters(),
            },
            "faults_injected": faults,
            "final_jobs_over_time": self.progress[:: max(1, len(self.progress) // 20)],
            **({"per_latency": self.latency_figures} if p.scenario == LATENCY else {}),
            **figures,
            "environment": {
                "python": platform.python_version(),
                "postgresql": pg.server_version(self.data_dir),
                "cpus": os.cpu_count(),
                "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            },
        }

    def hosts_parameters(self) -> dict[str, Any] | None:
        p = self.params
        if not p.hosts:
            return None
        netem = "available" if self.netem_error is None else f"unavailable ({self.netem_error})"
        return {
            "worker_hosts": p.hosts,
            "workers_per_host": [
                sum(1 for s in range(p.workers) if s % p.hosts == i) for i in range(p.hosts)
            ],
            "added_round_trip_ms": list(p.host_latency_ms),
            "latency_added_by": "a userspace TCP relay on the database host, half the round "
            "trip held back in each direction (tests/faults/proxy.py)",
            "tc_netem": netem,
            "network": "network namespaces on one machine, one virtual switch",
        }
