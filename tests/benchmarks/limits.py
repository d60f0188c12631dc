"""What flow control (queue limits) costs, and what it costs the queues that do not use it.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/limits.py \
        [--base REF] [--rounds 3] [--calls 2000] [--drain 20000] [--jobs 20000] \
        [--keys 1000] [--backlogs 10000,1000000] [--claims 200] [--out DIR]

Runs on the suite's PostgreSQL (the embedded one unless DATABASE_URL is
set), each measuring process in a scratch database of its own, one after
another within each round, so that a loaded machine slows every side alike:

- **Free when unused**: plain `task.enqueue()` calls (one per transaction,
  autocommit) and the drain of `--drain` plain jobs by an in-process burst
  worker (concurrency 4), by the code of `--base` (default e46226f, the
  commit before flow control, taken with `git archive`) and by this tree,
  each in a process of its own importing its own tree, with its own
  migrations. Each also EXPLAINs protocol.CLAIM (one queue, three queues)
  over the ready jobs, so the plans of both trees can be compared.
- **Limited claims**: `--jobs` no-op jobs of one queue drained by real
  `conveyor_worker --processes 8 --concurrency 8` processes (64 slots),
  the queue without limits, with `concurrency` 50, with a `rate` that does
  not bind (1000000/s) and with `key_concurrency` 1 over `--keys` keys, in
  a rotated order each round. The workers run until the parent sees every
  job completed (not --burst: a burst worker that finds no room under a
  limit and holds nothing would exit and leave fewer processes); the rate
  is the jobs over the span from the first start to the last finish. Every
  0.25 s the parent samples the running rows (checking the limits held)
  and the backends waiting for a lock; after the drain it counts the
  claims (a claim stamps all its jobs' started_at with one time).
- **Fair claim under a backlog**: a `fair` queue with a backlog of one key
  (one INSERT ... SELECT generate_series) ahead of 100 jobs of 10 other
  keys, for each of `--backlogs`: how many CLAIM_LIMITED calls of 10
  (completing what they claim) until the 100 small-key jobs were all
  claimed, then `--claims` calls (lock_limited + claim_limited in a
  transaction, rolled back, so each sees the same 11 keys) timed, and the
  shared buffers of 20 of them (EXPLAIN (ANALYZE, BUFFERS)).

Prints the per-round figures, the medians and the ratios, and writes
`limits-<date>.json` to --out when given. Figures depend on the machine and
its load: compare sides of one run, not runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DATABASE = "conveyor_limits_bench"
BASE = "e46226f"  # The commit before flow control.
QUEUE = "slow"  # A queue of the test settings' backend, claimed by nothing else here.
VARIANTS = ("none", "concurrency", "rate", "key")
OWNER = "bench:1:limits"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", default=BASE, help=f"git ref of the code before (default {BASE})")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--drain", type=int, default=20000)
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--backlogs", default="10000,1000000")
    ap.add_argument("--claims", type=int, default=200)
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: free,limited,fair")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--measure", choices=["plain", "limited", "fair"], help=argparse.SUPPRESS)
    ap.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    return ap.parse_args()


# -- inside one measuring process ---------------------------------------------------------------


def setup(database: str) -> None:
    sys.path.insert(0, str(HERE))
    import scratch

    scratch.setup_django(database)
    scratch.recreate(database)
    import logging

    from django.core.management import call_command

    logging.getLogger("django.tasks").setLevel(logging.WARNING)  # As the drain benchmark does.
    call_command("migrate", verbosity=0)


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def truncate() -> None:
    sql("TRUNCATE conveyor_job CASCADE")
    sql("VACUUM ANALYZE conveyor_job")


def copies(template: int, count: int, key: str) -> None:
    """`count` copies of job `template` in one INSERT ... SELECT; `key` is an SQL
    expression of `g` (the series) for their concurrency_key. The template goes."""
    columns = [
        row[0]
        for row in sql(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'conveyor_job' AND column_name <> 'id' ORDER BY ordinal_position"
        )
    ]
    values = [key if c == "concurrency_key" else f"t.{c}" for c in columns]
    sql(
        f"INSERT INTO conveyor_job ({', '.join(columns)}) "
        f"SELECT {', '.join(values)} FROM conveyor_job AS t, generate_series(1, %s) AS g "
        "WHERE t.id = %s",
        [count, template],
    )
    sql("DELETE FROM conveyor_job WHERE id = %s", [template])


def plan_shape(node: dict[str, Any], depth: int = 0) -> list[str]:
    """The plan's nodes, indented, with the index or relation each reads."""
    name = node["Node Type"]
    if "Index Name" in node:
        name += f" using {node['Index Name']}"
    elif "Relation Name" in node:
        name += f" on {node['Relation Name']}"
    if "Subplan Name" in node:
        name += f" ({node['Subplan Name']})"
    lines = ["  " * depth + name]
    for child in node.get("Plans", ()):
        lines += plan_shape(child, depth + 1)
    return lines


def explain_claim(queues: list[str]) -> dict[str, Any]:
    """EXPLAIN of protocol.CLAIM on a worker's kind of connection (no execution)."""
    from django_conveyor import protocol
    from django_conveyor.worker.connections import connect

    params = {"queues": queues, "limit": 10, "owner": OWNER, "lease": 30.0}
    with connect("default") as conn, conn.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + protocol.CLAIM, params)
        plan = cur.fetchone()[0][0]["Plan"]
        cur.execute("EXPLAIN " + protocol.CLAIM, params)
        text = [row[0] for row in cur.fetchall()]
    return {"shape": plan_shape(plan), "cost": plan["Total Cost"], "text": text}


def measure_plain(args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue and drain of plain jobs, by whichever tree this process imports."""
    from django_conveyor.models import Job
    from django_conveyor.worker.config import WorkerOptions
    from django_conveyor.worker.loop import Worker
    from tests.testapp.tasks import add, noop

    truncate()
    started, used = time.perf_counter(), time.process_time()
    for i in range(args.calls):
        add.enqueue(i, i)
    enqueue_us = (time.perf_counter() - started) / args.calls * 1e6
    enqueue_cpu_us = (time.process_time() - used) / args.calls * 1e6
    truncate()
    for start in range(0, args.drain, 10_000):
        noop.enqueue_many([((), {}) for _ in range(min(10_000, args.drain - start))])
    sql("VACUUM ANALYZE conveyor_job")
    plans = {
        "one_queue": explain_claim(["default"]),
        "three_queues": explain_claim(["default", "emails", "slow"]),
    }
    started = time.perf_counter()
    worker = Worker(WorkerOptions(queues=("default",), concurrency=4, burst=True, listen=False,
                                  stop_signals=()))  # fmt: skip
    assert worker.run() == 0
    seconds = time.perf_counter() - started
    assert Job.objects.filter(state="completed").count() == args.drain
    return {
        "enqueue_us": enqueue_us,
        "enqueue_cpu_us": enqueue_cpu_us,
        "drain_s": seconds,
        "drain_jobs_per_s": args.drain / seconds,
        "plans": plans,
    }


def variant_limits(variant: str) -> Any:
    from django_conveyor.limits import Limits, Rate

    return {
        "none": Limits(),
        "concurrency": Limits(concurrency=50),
        "rate": Limits(rate=Rate(1_000_000, 1)),
        "key": Limits(key_concurrency=1),
    }[variant]


def drain_by_workers(args: argparse.Namespace, variant: str, log: Path) -> dict[str, Any]:
    """`args.jobs` no-op jobs of QUEUE, drained by real worker processes under `variant`."""
    from django_conveyor import limits
    from tests.testapp.tasks import noop

    truncate()
    limits.set_limits(QUEUE, variant_limits(variant), actor="benchmark")
    keyed = variant == "key"
    template = noop.using(queue_name=QUEUE).enqueue()
    key = f"'k' || mod(g, {args.keys})" if keyed else "NULL"
    copies(int(template.id), args.jobs, key)
    sql("VACUUM ANALYZE conveyor_job")
    sql("VACUUM ANALYZE conveyor_queue")
    command = [sys.executable, "-m", "django", "conveyor_worker", "--queues", QUEUE,
               "--concurrency", str(args.slots), "--processes", str(args.processes),
               "--no-cron", "-v", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    max_running, waiting = 0, []  # Backends of this database waiting for a lock, per sample.
    started = time.perf_counter()
    with log.open("ab") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            deadline = started + 600
            while time.perf_counter() < deadline:
                time.sleep(0.25)
                ((running, done, key_max),) = sql(
                    "SELECT count(*) FILTER (WHERE state = 'running'), "
                    "count(*) FILTER (WHERE state = 'completed'), "
                    "coalesce((SELECT max(n) FROM (SELECT count(*) AS n FROM conveyor_job "
                    "  WHERE state = 'running' AND concurrency_key IS NOT NULL "
                    "  GROUP BY concurrency_key) AS k), 0) "
                    "FROM conveyor_job WHERE queue = %s",
                    [QUEUE],
                )
                max_running = max(max_running, running)
                ((locked,),) = sql(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
                waiting.append(locked)
                if keyed:
                    assert key_max <= 1, f"a key ran {key_max} jobs at once"
                if done == args.jobs or proc.poll() is not None:
                    break
        finally:
            wall = time.perf_counter() - started
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    ((done, span, owners),) = sql(
        "SELECT count(*), date_part('epoch', max(finished_at) - min(started_at)), "
        "count(DISTINCT split_part(lease_owner, ':', 2)) FROM conveyor_job "
        "WHERE queue = %s AND state = 'completed'",
        [QUEUE],
    )
    assert done == args.jobs, f"{variant}: {done} of {args.jobs} completed"
    # A claim stamps its jobs' started_at with one time (CLAIM: the transaction's now(),
    # CLAIM_LIMITED: the stamp taken under the lock), so this counts the claims that got jobs.
    ((claims,),) = sql(
        "SELECT count(DISTINCT (lease_owner, started_at)) FROM conveyor_job WHERE queue = %s",
        [QUEUE],
    )
    if variant == "concurrency":
        assert max_running <= 50, max_running
    return {
        "jobs_per_s": done / span,
        "span_s": span,
        "wall_s": wall,  # With the processes' start.
        "processes_that_ran_jobs": owners,
        "max_running_sampled": max_running,
        "jobs_per_claim": done / claims,
        "lock_waiters_mean": statistics.mean(waiting) if waiting else 0.0,
        "lock_waiters_max": max(waiting, default=0),
    }


def measure_limited(args: argparse.Namespace) -> dict[str, Any]:
    """This tree only: each variant once, in an order rotated by the round."""
    order = VARIANTS[args.round % len(VARIANTS) :] + VARIANTS[: args.round % len(VARIANTS)]
    log = Path(tempfile.gettempdir()) / f"conveyor-limits-bench-workers-{os.getpid()}.log"
    figures: dict[str, Any] = {"order": list(order)}
    for variant in order:
        figures[variant] = drain_by_workers(args, variant, log)
        print(f"  {variant}: {json.dumps(figures[variant])}", file=sys.stderr)
    log.unlink(missing_ok=True)
    return figures


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def fair_backlog(args: argparse.Namespace, backlog: int) -> dict[str, Any]:
    import psycopg

    from django_conveyor import limits, protocol
    from django_conveyor.limits import Limits
    from django_conveyor.worker.connections import connect
    from tests.testapp.tasks import noop

    def small_jobs() -> None:
        for k in range(10):
            task = noop.using(queue_name=QUEUE, concurrency_key=f"small:{k}")
            task.enqueue_many([((), {}) for _ in range(10)])

    truncate()
    sql("UPDATE conveyor_queue SET fair_cursor = NULL WHERE name = %s", [QUEUE])
    limits.set_limits(QUEUE, Limits(fair=True), actor="benchmark")
    template = noop.using(queue_name=QUEUE, concurrency_key="big").enqueue()
    started = time.perf_counter()
    copies(int(template.id), backlog, "'big'")
    insert_s = time.perf_counter() - started
    small_jobs()  # Behind the backlog in claim order.
    sql("VACUUM ANALYZE conveyor_job")
    figures: dict[str, Any] = {"backlog": backlog, "insert_s": insert_s}
    params = {
        "queue": QUEUE,
        "limit": 10,
        "free": 10,
        "owner": OWNER,
        "lease": 30.0,
        "isolated": False,
    }

    with connect("default") as conn, conn.cursor() as cur:
        # Fairness: claim 10 at a time, completing what was claimed, until every small job ran.
        small_claimed, claims, fair_ms, big_claimed = 0, 0, [], 0
        while small_claimed < 100 and claims < 10_000:
            with conn.transaction():
                protocol.lock_limited(cur, queues=[QUEUE])
                t0 = time.perf_counter()
                leases = protocol.claim_limited(cur, owner=OWNER, queue=QUEUE, limit=10,
                                                lease_seconds=30.0)  # fmt: skip
                fair_ms.append((time.perf_counter() - t0) * 1e3)
                ids = [lease.id for lease in leases]
                cur.execute("SELECT count(*) FROM conveyor_job WHERE id = ANY(%s) "
                            "AND concurrency_key LIKE 'small:%%'", [ids])  # fmt: skip
                small = cur.fetchone()[0]
                done = [(lease.id, lease.version, None) for lease in leases]
                protocol.complete(cur, owner=OWNER, done=done, notify=False)
            claims += 1
            small_claimed += small
            big_claimed += len(ids) - small
        figures["fairness"] = {
            "claims_until_all_small_claimed": claims,
            "small_claimed": small_claimed,
            "big_claimed_meanwhile": big_claimed,
            "claim_ms_median": statistics.median(fair_ms),
        }
        # The same state each call: 100 small jobs of 10 keys again, and every call rolled back.
        small_jobs()
        cur.execute("VACUUM ANALYZE conveyor_job")
        times, got = [], []
        for _ in range(args.claims):
            with conn.transaction():
                protocol.lock_limited(cur, queues=[QUEUE])
                t0 = time.perf_counter()
                leases = protocol.claim_limited(cur, owner=OWNER, queue=QUEUE, limit=10,
                                                lease_seconds=30.0)  # fmt: skip
                times.append((time.perf_counter() - t0) * 1e3)
                got.append(len(leases))
                raise psycopg.Rollback()
        buffers, executions, planning, planning_ms = [], [], [], []
        for _ in range(20):
            with conn.transaction():
                protocol.lock_limited(cur, queues=[QUEUE])
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + protocol.CLAIM_LIMITED,
                            params)  # fmt: skip
                top = cur.fetchone()[0][0]
                plan = top["Plan"]
                buffers.append(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
                executions.append(top["Execution Time"])
                planning.append(top.get("Planning", {}).get("Shared Hit Blocks", 0))
                planning_ms.append(top["Planning Time"])
                raise psycopg.Rollback()
    figures["claim_ms"] = {
        "calls": len(times),
        "median": statistics.median(times),
        "p99": percentile(times, 0.99),
        "max": max(times),
        "jobs_per_call_median": statistics.median(got),
    }
    figures["explain"] = {
        "shared_buffers_median": statistics.median(buffers),
        "shared_buffers_max": max(buffers),
        "execution_ms_median": statistics.median(executions),
        "planning_shared_hit_median": statistics.median(planning),
        "planning_ms_median": statistics.median(planning_ms),
    }
    return figures


def measure_fair(args: argparse.Namespace) -> dict[str, Any]:
    figures = {}
    for backlog in (int(b) for b in args.backlogs.split(",")):
        figures[str(backlog)] = fair_backlog(args, backlog)
        print(f"  backlog {backlog}: {json.dumps(figures[str(backlog)])}", file=sys.stderr)
    return figures


def measuring_process(args: argparse.Namespace) -> None:
    setup(os.environ["CONVEYOR_DB_NAME"])
    measure = {"plain": measure_plain, "limited": measure_limited, "fair": measure_fair}
    figures: dict[str, Any] = measure[args.measure](args)
    import django_conveyor

    figures["package"] = str(Path(django_conveyor.__file__).parent)  # Which tree ran.
    print(json.dumps(figures))
    sys.path.insert(0, str(HERE))
    import scratch

    scratch.drop(os.environ["CONVEYOR_DB_NAME"])


# -- the parent ---------------------------------------------------------------------------------


def base_tree(ref: str, into: Path) -> tuple[str, Path]:
    """The code of `ref`, as files in `into`."""
    full = subprocess.run(["git", "rev-parse", ref], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "archive", full], cwd=REPO, check=True, capture_output=True)
    path = into / "tree.tar"
    path.write_bytes(archive.stdout)
    with tarfile.open(path) as tar:
        tar.extractall(into / "base", filter="data")
    return full, into / "base"


def run(tree: Path, measure: str, args: argparse.Namespace, label: str, rnd: int = 0) -> Any:
    """One measuring process importing `tree` (its package, its tests, its migrations).

    It runs this file (the base tree has none), with `tree` first on its path."""
    command = [sys.executable, str(HERE / "limits.py"), "--measure", measure, "--round", str(rnd)]
    for name in ("calls", "drain", "jobs", "keys", "processes", "slots", "backlogs", "claims"):
        command += [f"--{name}", str(getattr(args, name))]
    # Every process uses this tree's PostgreSQL server, wherever it runs from.
    data_dir = Path(os.environ.get("CONVEYOR_DATA_DIR") or REPO / "var" / "pg-tests").resolve()
    env = {**os.environ, "PYTHONPATH": str(tree), "CONVEYOR_DATA_DIR": str(data_dir),
           "CONVEYOR_DB_NAME": f"{DATABASE}_{label}"}  # fmt: skip
    done = subprocess.run(command, cwd=tree, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    args = parse_args()
    if args.measure:
        measuring_process(args)
        return 0
    skip = set(filter(None, args.skip.split(",")))
    rounds: list[dict[str, Any]] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="conveyor-limits-bench-") as tmp:
        ref, before = base_tree(args.base, Path(tmp))
        for number in range(args.rounds):
            figures: dict[str, Any] = {"load_before": load()}
            if "free" not in skip:
                figures["before"] = run(before, "plain", args, "before")
                figures["after"] = run(REPO, "plain", args, "after")
            if "limited" not in skip:
                figures["limited"] = run(REPO, "limited", args, "limited", number)
            figures["load_after"] = load()
            rounds.append(figures)
            brief = {k: v for k, v in figures.items() if k not in ("before", "after")}
            print(f"round {number + 1}: {json.dumps(brief)}", file=sys.stderr)
        fair = None if "fair" in skip else run(REPO, "fair", args, "fair")
    summary: dict[str, Any] = {}

    def median(*path: str) -> float:
        values = []
        for r in rounds:
            value: Any = r
            for part in path:
                value = value[part]
            values.append(value)
        return statistics.median(values)

    if "free" not in skip:
        summary["free_when_unused"] = {
            "plain_enqueue_us": {"before": median("before", "enqueue_us"),
                                 "after": median("after", "enqueue_us")},
            "plain_enqueue_cpu_us": {"before": median("before", "enqueue_cpu_us"),
                                     "after": median("after", "enqueue_cpu_us")},
            "plain_drain_jobs_per_s": {"before": median("before", "drain_jobs_per_s"),
                                       "after": median("after", "drain_jobs_per_s")},
        }  # fmt: skip
        free = summary["free_when_unused"]
        free["enqueue_after_over_before"] = (
            free["plain_enqueue_us"]["after"] / free["plain_enqueue_us"]["before"]
        )
        free["drain_after_over_before"] = (
            free["plain_drain_jobs_per_s"]["after"] / free["plain_drain_jobs_per_s"]["before"]
        )
        same = {}
        for which in ("one_queue", "three_queues"):
            shapes = {
                (side, tuple(r[side]["plans"][which]["shape"]))
                for r in rounds
                for side in ("before", "after")
            }
            same[which] = len({shape for _, shape in shapes}) == 1
        free["claim_plan_same_shape"] = same
        # The part that reads conveyor_job (the queue filter reads only conveyor_queue).
        free["claim_plan_same_job_side"] = {
            which: len(
                {
                    tuple(line.strip() for line in r[side]["plans"][which]["shape"]
                          if "conveyor_job" in line)
                    for r in rounds
                    for side in ("before", "after")
                }
            ) == 1
            for which in ("one_queue", "three_queues")
        }  # fmt: skip
        free["claim_plan"] = {
            side: {w: rounds[0][side]["plans"][w]["shape"] for w in ("one_queue", "three_queues")}
            for side in ("before", "after")
        }
    if "limited" not in skip:
        limited = {v: median("limited", v, "jobs_per_s") for v in VARIANTS}
        summary["limited_drain_jobs_per_s"] = limited
        summary["limited_over_none"] = {v: limited[v] / limited["none"] for v in VARIANTS[1:]}
    if fair is not None:
        summary["fair"] = {
            b: {
                "claim_ms_median": f["claim_ms"]["median"],
                "claim_ms_p99": f["claim_ms"]["p99"],
                "shared_buffers_median": f["explain"]["shared_buffers_median"],
                "claims_until_all_small_claimed": f["fairness"]["claims_until_all_small_claimed"],
            }
            for b, f in fair.items()
            if b != "package"
        }
    result = {
        "date": dt.date.today().isoformat(),
        "base": ref,
        "cpus": os.cpu_count(),
        "seconds": round(time.perf_counter() - began, 1),
        "options": {k: getattr(args, k) for k in ("rounds", "calls", "drain", "jobs", "keys",
                                                  "processes", "slots", "backlogs", "claims")},
        "rounds": rounds,
        "fair": fair,
        "summary": summary,
    }  # fmt: skip
    sys.path.insert(0, str(HERE))
    import scratch

    scratch.report(result, args.out, "limits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
