"""The failover experiment: a producer, four workers, and the primary lost mid-run.

One scenario per process (a fresh cluster each): `kill9` (the primary's
postmaster and its keeper SIGKILLed at once: the host crashed) or
`partition` (the primary's host cut off the network, healed later). The
monitor promotes the standby; the old primary comes back (restarted, or
healed) and rejoins as a standby. The verdict reuses the fault runs'
checks (tests/faults/verify.py) on the surviving primary, held against
the producer's record of acknowledged enqueues.

With `--replication async` the standby is asynchronous, and the primary's
WAL sender is frozen for `--standby-lag` seconds just before the fault (as
a slow link would leave the standby behind): what was acknowledged in that
window never left the old primary, and is lost with it. (Under synchronous
replication the same freeze only holds the commits back: none is
acknowledged until the standby has it.) That run reports the loss and passes if nothing
else went wrong; a synchronous run passes only with nothing lost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from tests.faults import verify
from tests.faults.workers import WorkerPool

from .cluster import Cluster, Node, running_cluster
from .producer import Producer

logger = logging.getLogger("ha")

SCENARIOS = ("kill9", "partition")
REPLICATION = ("sync", "async")
WORKERS = 4
FAULT_AT = 0.5  # The fault strikes once this fraction of the jobs is acknowledged.
HEAL_AFTER_SECONDS = 20.0  # A partition lasts until this long after the promotion.
RATE_WINDOW_SECONDS = 10.0
MONITOR_SECONDS = 0.5
REJOIN_TIMEOUT_SECONDS = 120.0
EVENTS_AFTER_FAULT_SECONDS = 900.0  # The monitor events the JSON keeps.

JOB_KEYS = "SELECT idempotency_key, id, state FROM conveyor_job"
FINISHED = "SELECT extract(epoch FROM finished_at) FROM conveyor_job WHERE state = 'completed'"
FINAL = verify.FINAL_STATES
TICK_PREFIX = "cron:ha-tick:"
TICKS_DONE = """
SELECT count(*) FROM conveyor_job WHERE idempotency_key LIKE %(prefix)s AND state = 'completed'
"""
NOT_FINAL = "SELECT count(*) FROM conveyor_job WHERE id = ANY(%(ids)s) AND state <> ALL(%(final)s)"
WAL_SENDERS = "SELECT pid FROM pg_stat_replication"


@dataclass(frozen=True, slots=True, kw_only=True)
class Params:
    scenario: str
    replication: str
    jobs: int
    concurrency: int
    seed: int
    work_seconds: tuple[float, float]
    inside_seconds: tuple[float, float]
    standby_lag: float
    timeout: float
    out: Path
    keep: Path | None


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(description="Lose the primary mid-run; count what survived.")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--replication", choices=REPLICATION, default="sync")
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--out", type=Path, required=True, help="Folder for failover-*.json.")
    parser.add_argument("--concurrency", type=int, default=4, help="Slots per worker (4 workers).")
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--work", type=float, nargs=2, default=(0.0, 0.05), metavar=("MIN", "MAX"))
    parser.add_argument(
        "--inside", type=float, nargs=2, default=(0.0, 0.01), metavar=("MIN", "MAX")
    )
    parser.add_argument(
        "--standby-lag",
        type=float,
        default=None,
        metavar="SECONDS",
        help="Freeze the primary's WAL senders this long before the fault "
        "(default 0 for sync, 2 for async).",
    )
    parser.add_argument("--timeout", type=float, default=None, help="Deadline per scenario.")
    parser.add_argument("--keep", type=Path, default=None, help="Copy worker and node logs here.")
    args = parser.parse_args(argv)
    if args.jobs < 10 or args.concurrency < 1:
        parser.error("--jobs must be 10 or more and --concurrency 1 or more.")
    return args, list(argv if argv is not None else sys.argv[1:])


def params_for(args: argparse.Namespace, scenario: str) -> Params:
    lag = args.standby_lag
    if lag is None:
        lag = 2.0 if args.replication == "async" else 0.0
    return Params(
        scenario=scenario,
        replication=args.replication,
        jobs=args.jobs,
        concurrency=args.concurrency,
        seed=args.seed,
        work_seconds=tuple(args.work),
        inside_seconds=tuple(args.inside),
        standby_lag=lag,
        timeout=args.timeout or 300 + args.jobs * 0.1,
        out=args.out,
        keep=args.keep,
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s ha %(message)s")
    args, raw = parse_args(argv)
    if args.scenario == "all":
        # One process per scenario: each gets a fresh cluster and fresh Django settings.
        codes = []
        for scenario in SCENARIOS:
            again = [*_without(raw, "--scenario"), "--scenario", scenario]
            codes.append(subprocess.run([sys.executable, sys.argv[0], *again]).returncode)
        return max(codes)
    signal.signal(signal.SIGTERM, _interrupt)
    params = params_for(args, args.scenario)
    result = Run(params).execute()
    params.out.mkdir(parents=True, exist_ok=True)
    name = params.scenario if params.replication == "sync" else f"async-{params.scenario}"
    path = params.out / f"failover-{name}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    head = {k: result[k] for k in ("acknowledged", "completed", "lost", "duplicate_effects")}
    logger.info("%s (%s): %s -> %s", params.scenario, params.replication, head, path)
    for failure in result["failures"]:
        logger.error("FAIL: %s", failure)
    return 0 if result["passed"] else 1


def _without(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(f"{flag}="):
            out.append(arg)
    return out


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Run:
    def __init__(self, params: Params) -> None:
        self.params = params
        self.work = Path(tempfile.mkdtemp(prefix="conveyor-failover-"))
        self.log_dir = self.work / "logs"
        self.log_dir.mkdir()
        self.fault_at: float | None = None
        self.lag_began: float | None = None  # When the WAL senders were frozen.
        self.promoted: Node | None = None
        self.timeline: dict[str, float] = {}
        self.progress: list[tuple[float, int]] = []
        self.load_before = os.getloadavg()

    def execute(self) -> dict[str, Any]:
        p = self.params
        logger.info(
            "%s, %s replication: %d jobs, %d workers x %d, deadline %.0fs",
            p.scenario,
            p.replication,
            p.jobs,
            WORKERS,
            p.concurrency,
            p.timeout,
        )
        try:
            with running_cluster(synchronous=p.replication == "sync", keep=p.keep) as cluster:
                return self.on(cluster)
        finally:
            if p.keep:
                p.keep.mkdir(parents=True, exist_ok=True)
                for log in self.log_dir.glob("*"):
                    shutil.copy(log, p.keep / log.name)
            shutil.rmtree(self.work, ignore_errors=True)

    def on(self, cluster: Cluster) -> dict[str, Any]:
        p = self.params
        start = time.monotonic()
        env = {
            "CONVEYOR_FAULTS_PG_HOST": cluster.hosts,
            "CONVEYOR_FAULTS_PG_PORT": cluster.ports,
            "CONVEYOR_FAULTS_PG_NAME": "conveyor",
            "CONVEYOR_FAULTS_FOLLOW_PRIMARY": "1",
            "CONVEYOR_FAULTS_CRON": "1",  # The workers' schedulers tick every second.
        }
        os.environ.update(env)
        os.environ["DJANGO_SETTINGS_MODULE"] = "tests.faults.settings"
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        from tests.faults.settings import QUEUE

        pool = WorkerPool(
            queue=QUEUE,
            count=WORKERS,
            concurrency=p.concurrency,
            db_port=0,
            log_dir=self.log_dir,
            extra_env=env,
        )
        producer = Producer(
            jobs=p.jobs,
            record=self.log_dir / "acknowledged.txt",
            seed=p.seed,
            work_seconds=p.work_seconds,
            inside_seconds=p.inside_seconds,
        )
        first = cluster.primary()
        assert first is not None
        try:
            pool.start_all()
            # The workers are up (and their schedulers ticking) before the first enqueue.
            self.wait(lambda: self.ticks_completed(cluster) >= 2, start)
            producer.start()
            self.wait(lambda: len(producer.acked) >= p.jobs * FAULT_AT or producer.done, start)
            self.strike(cluster, first)
            self.wait(lambda: producer.done, start)
            self.wait(lambda: self.all_final(cluster, producer), start)
            settled = time.monotonic() - start
            self.wait_rejoined(cluster, first)
        finally:
            producer.stop()
            pool.stop_all()
        return self.verdict(cluster, first, producer, pool, time.monotonic() - start, settled)

    def wait(self, done: Any, start: float) -> None:
        while not done():
            if time.monotonic() - start > self.params.timeout:
                return
            time.sleep(MONITOR_SECONDS)

    def all_final(self, cluster: Cluster, producer: Producer) -> bool:
        ids = [job for _, job, _ in producer.acked]
        try:
            with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
                (left,) = conn.execute(  # type: ignore[misc]
                    NOT_FINAL, {"ids": ids, "final": list(verify.FINAL_STATES)}
                ).fetchone()
        except psycopg.Error:
            return False
        self.progress.append((round(time.time() - (self.fault_at or 0), 1), len(ids) - left))
        return left == 0

    def ticks_completed(self, cluster: Cluster) -> int:
        try:
            with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
                row = conn.execute(TICKS_DONE, {"prefix": TICK_PREFIX + "%"}).fetchone()
        except psycopg.Error:
            return 0
        return int(row[0]) if row else 0

    def strike(self, cluster: Cluster, old: Node) -> None:
        """Lose the primary; wait for the promotion; bring the old one back."""
        p = self.params
        frozen = self.freeze_wal_senders(old) if p.standby_lag else []
        logger.info("%s: losing primary %s", p.scenario, old.name)
        self.fault_at = cluster.crash(old) if p.scenario == "kill9" else cluster.cut(old)
        for pid in frozen:  # (Dead with the postmaster after a kill; cut off after a cut.)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + p.timeout
        while (new := cluster.primary()) in (None, old):
            if time.monotonic() > deadline:
                raise RuntimeError("The monitor never promoted the standby.")
            time.sleep(0.2)
        self.promoted = new
        self.timeline["promotion_settled_after_fault_s"] = time.time() - self.fault_at
        logger.info("%s promoted after %.1fs", new.name, time.time() - self.fault_at)
        if p.scenario == "kill9":
            cluster.restart(old)
        else:
            time.sleep(HEAL_AFTER_SECONDS)
            cluster.heal(old)
        self.timeline["old_primary_back_after_fault_s"] = time.time() - self.fault_at

    def freeze_wal_senders(self, primary: Node) -> list[int]:
        """SIGSTOP the primary's WAL senders: the standby falls behind for `standby_lag` s."""
        with primary.local() as conn:
            pids = [int(r[0]) for r in conn.execute(WAL_SENDERS).fetchall()]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self.lag_began = time.time()
        time.sleep(self.params.standby_lag)
        return pids

    def wait_rejoined(self, cluster: Cluster, old: Node) -> None:
        """Until the old primary is a standby again (when it got there: the monitor's events)."""
        deadline = time.monotonic() + REJOIN_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if cluster.states().get(old.name) == "secondary":
                return
            time.sleep(MONITOR_SECONDS)

    # -- the verdict ---------------------------------------------------------

    def verdict(
        self,
        cluster: Cluster,
        first: Node,
        producer: Producer,
        pool: WorkerPool,
        duration: float,
        settled: float,
    ) -> dict[str, Any]:
        p = self.params
        facts = verify.read_logs(sorted(self.log_dir.glob("worker-*.log")))
        acked = producer.acked
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            figures = verify.check(conn, len(acked), facts)
            # By idempotency key, not id: a job lost with an asynchronous primary
            # leaves its id to be handed out again by the new primary's sequence.
            rows = {key: (job, state) for key, job, state in conn.execute(JOB_KEYS).fetchall()}
            finished = sorted(float(r[0]) for r in conn.execute(FINISHED).fetchall())
            server = conn.execute("SELECT inet_server_addr()::text").fetchone()
        ticks = sorted(_tick_instant(k) for k in rows if k and k.startswith(TICK_PREFIX))
        figures["jobs"] = len(acked) + len(ticks)  # Every tick is a job of the handler too.
        keys = {producer.key(seq): (seq, job, at) for seq, job, at in acked}
        missing = [keys[k] for k in keys if k not in rows]
        unfinished = [v for k, v in keys.items() if k in rows and rows[k][1] not in FINAL]
        renumbered = sum(1 for k, (_, job, _) in keys.items() if k in rows and rows[k][0] != job)
        extra = sum(1 for k in rows if k not in keys and not (k or "").startswith(TICK_PREFIX))
        scheduler = self.scheduler(ticks)
        if p.replication == "sync" and scheduler["seconds_without_a_tick"]:
            failed_ticks = f"{scheduler['seconds_without_a_tick']} second(s) got no tick job."
        else:
            failed_ticks = None
        lost = sorted(missing + unfinished)
        figures["lost"] = len(lost)
        failed = verify.failures(figures, require_stale=False)
        if failed_ticks:
            failed.append(failed_ticks)
        if self.promoted and not scheduler["ticks_after_promotion"]:
            failed.append("No tick was enqueued after the promotion: the scheduler never followed.")
        if p.replication == "async":
            # The loss is the measured boundary here, not a failure.
            failed = [f for f in failed if "did not complete" not in f and "not final" not in f]
        if producer.failure is not None:
            failed.append(f"The producer failed: {producer.failure!r}")
        if not producer.finished_at:
            failed.append(
                f"The producer acknowledged {len(acked)} of {p.jobs} jobs by the deadline."
            )
        if self.promoted is None:
            failed.append("No failover happened.")
        after = [t for t in finished if self.fault_at and t > self.fault_at]
        first_new = after[0] if after else None
        conf = _conveyor_settings()
        head = verify.headline(figures)
        events = self.events(cluster)
        return {
            "scenario": p.scenario,
            "replication": "synchronous" if p.replication == "sync" else "asynchronous",
            "acknowledged": len(acked),
            "jobs": head.pop("jobs"),  # The acknowledged ones and the scheduler's ticks.
            **head,
            "passed": not failed,
            "failures": failed,
            "lost_acknowledged_jobs": {
                "not_in_surviving_database": len(missing),
                "not_final": len(unfinished),
                "acknowledged_after_fault_s": self.span([at for _, _, at in lost]),
                "sample": [{"seq": seq, "id_when_acknowledged": job} for seq, job, _ in lost[:20]],
                "acknowledged_during_standby_lag": self.acked_during_lag(producer),
            },
            "acknowledged_jobs_found_under_another_id": renumbered,
            "scheduler": scheduler,
            "rows_without_acknowledgement": extra,
            "failover": {
                "old_primary": first.name,
                "new_primary": self.promoted.name if self.promoted else None,
                "served_by_at_the_end": server[0] if server else None,
                **{k: round(v, 2) for k, v in self.timeline.items()},
                "first_completion_on_new_primary_after_fault_s": (
                    round(first_new - self.fault_at, 2) if first_new and self.fault_at else None
                ),
                **self.milestones(events, first.name),
                "monitor_events": events,
            },
            "drain_rate_per_s": self.rates(finished, first_new, [t for _, _, t in acked]),
            "enqueue": producer.summary(self.fault_at),
            "duration_s": round(duration, 1),
            "all_final_after_s": round(settled, 1),
            "parameters": {
                "workers": WORKERS,
                "concurrency": p.concurrency,
                "lease_s": conf.LEASE_SECONDS,
                "heartbeat_s": conf.HEARTBEAT_SECONDS,
                "reap_s": conf.REAP_SECONDS,
                "seed": p.seed,
                "handler_work_s": list(p.work_seconds),
                "handler_inside_transaction_s": list(p.inside_seconds),
                "fault_at_fraction_acknowledged": FAULT_AT,
                "standby_lag_s": p.standby_lag,
                "heal_after_promotion_s": HEAL_AFTER_SECONDS if p.scenario == "partition" else None,
                "deadline_s": p.timeout,
                "failover_manager": "pg_auto_failover 2.0 (Debian)",
                "monitor_tuning_ms": _tuning(),
                "hosts": "network namespaces on one machine, one virtual switch",
            },
            "final_jobs_over_time": self.progress[:: max(1, len(self.progress) // 20)],
            **figures,
            "worker_incarnations": len(pool.history),
            "environment": {
                "python": platform.python_version(),
                "postgresql": "15",
                "cpus": os.cpu_count(),
                "load_average_before": [round(x, 2) for x in self.load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        }

    def scheduler(self, ticks: list[float]) -> dict[str, Any]:
        """The workers' cron ticks (one a second): none missing, some after the promotion."""
        promoted = (self.fault_at or 0) + self.timeline.get("promotion_settled_after_fault_s", 0)
        seconds = round(ticks[-1] - ticks[0]) + 1 if ticks else 0
        return {
            "schedule": "every second (one job per tick, the fault handler with no sleep)",
            "ticks": len(ticks),
            "seconds_without_a_tick": seconds - len(ticks),
            "ticks_before_fault": sum(1 for t in ticks if t < (self.fault_at or 0)),
            "ticks_after_promotion": sum(1 for t in ticks if t > promoted),
        }

    def span(self, times: list[float]) -> list[float] | None:
        if not times or self.fault_at is None:
            return None
        return [round(min(times) - self.fault_at, 3), round(max(times) - self.fault_at, 3)]

    def acked_during_lag(self, producer: Producer) -> dict[str, Any] | None:
        """Acknowledged between the freeze of the WAL senders and the fault: what may be lost."""
        if self.lag_began is None or self.fault_at is None:
            return None
        return {
            "began_after_fault_s": round(self.lag_began - self.fault_at, 2),
            "acknowledged": sum(
                1 for *_, t in producer.acked if self.lag_began <= t <= self.fault_at
            ),
        }

    def rates(
        self, finished: list[float], first_new: float | None, acked: list[float]
    ) -> dict[str, Any]:
        """Completions (and acknowledged enqueues) per second, and the backlog, in two windows.

        When the backlog stays near zero the workers kept up, and the drain
        rate is the producer's rate, not the workers' limit.
        """

        def window(lo: float) -> dict[str, float]:
            hi = lo + RATE_WINDOW_SECONDS
            done = sum(1 for t in finished if lo <= t < hi)
            enqueued = sum(1 for t in acked if lo <= t < hi)
            backlog = sum(1 for t in acked if t < hi) - sum(1 for t in finished if t < hi)
            return {
                "completed_per_s": round(done / RATE_WINDOW_SECONDS, 1),
                "acknowledged_enqueues_per_s": round(enqueued / RATE_WINDOW_SECONDS, 1),
                "backlog_at_end": max(backlog, 0),
            }

        if self.fault_at is None:
            return {}
        return {
            "window_s": RATE_WINDOW_SECONDS,
            "before_fault": window(self.fault_at - RATE_WINDOW_SECONDS),
            "after_first_completion_on_new_primary": window(first_new) if first_new else None,
        }

    @staticmethod
    def milestones(events: list[dict[str, Any]], old: str) -> dict[str, float | None]:
        """When the monitor saw the loss, and when the old primary was a standby again."""

        def first(match: Any) -> float | None:
            return next(
                (e["after_fault_s"] for e in events if e["after_fault_s"] > 0 and match(e)), None
            )

        return {
            "loss_noticed_after_fault_s": first(
                lambda e: e["node"] == old and e["goal"] == "draining"
            ),
            "old_primary_rejoined_after_fault_s": first(
                lambda e: e["node"] == old and e["reported"] == e["goal"] == "secondary"
            ),
            "standby_back_after_fault_s": first(
                lambda e: e["node"] != old and e["reported"] == e["goal"] == "primary"
            ),
        }

    def events(self, cluster: Cluster) -> list[dict[str, Any]]:
        if self.fault_at is None:
            return []
        out = []
        for e in cluster.events():
            at = e["eventtime"].timestamp() - self.fault_at
            if -2 < at < EVENTS_AFTER_FAULT_SECONDS:
                out.append(
                    {
                        "after_fault_s": round(at, 2),
                        "node": e["nodename"],
                        "reported": e["reportedstate"],
                        "goal": e["goalstate"],
                    }
                )
        return out


def _tick_instant(key: str) -> float:
    """The UTC instant in a tick's key, `cron:<name>:<ISO instant>Z`."""
    return (
        datetime.fromisoformat(key.removeprefix(TICK_PREFIX)[:-1]).replace(tzinfo=UTC).timestamp()
    )


def _conveyor_settings() -> Any:
    from django_conveyor.conf import conveyor_settings

    return conveyor_settings()


def _tuning() -> dict[str, int]:
    from .cluster import TUNING

    return {k.removeprefix("pgautofailover."): v for k, v in TUNING.items()}
