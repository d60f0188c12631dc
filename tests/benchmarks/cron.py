"""The scheduler's two figures: pass cost at 10,000 schedules, and tick lateness.

    python tests/benchmarks/cron.py [--schedules 10000] [--passes 300] [--seconds 60]
                                    [--out FILE.json]

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_cron_bench`, recreated each run).

1. Pass cost: `--schedules` enabled schedules, none due, and `--passes`
   calls of `ticks.run_once(cursor, now)`. Database time is the server's
   own execution time of the pass's statements (EXPLAIN ANALYZE of DUE and
   NEXT_TICK on the same data); the pass's wall time adds the round trips.
2. Lateness: one idle `conveyor_worker` process and a schedule that ticks
   every second for `--seconds`; each tick's lateness is its job's
   `enqueued_at` minus the tick instant (both the database's clock).

Prints one JSON document (and writes it to --out) and exits 1 only if a tick
did not get exactly one job. Not a timed test: figures depend on the
machine, so take them from a quiet one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import scratch  # noqa: E402  (beside this script)

DB_NAME = "conveyor_cron_bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3),
        "mean": round(statistics.fmean(values), 3),
    }


def setup_django() -> None:
    sys.path.insert(0, str(REPO))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["CONVEYOR_DB_NAME"] = DB_NAME
    import django

    django.setup()
    import psycopg
    from django.db import connections

    from django_conveyor.worker.connections import connection_params

    params = {**connection_params("default"), "dbname": "postgres"}
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DB_NAME}")
        admin.execute(f"CREATE DATABASE {DB_NAME}")
    connections["default"].close()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def indexes(node: dict) -> list[str]:
    """The indexes a JSON query plan reads (to show the partial index is used)."""
    found = [node["Index Name"]] if "Index Name" in node else []
    for child in node.get("Plans", []):
        found += indexes(child)
    return found


def pass_cost(schedules: int, passes: int) -> dict[str, object]:
    from django_conveyor.models import Cron
    from django_conveyor.periodic import ticks
    from django_conveyor.periodic.expressions import Timing
    from django_conveyor.worker.connections import connect

    conn = connect("default")
    now = ticks.database_now(conn.cursor())
    rows = []
    for n in range(schedules):
        expression = f"{n % 60} {n % 24} * * *"  # daily, spread over the day
        rows.append(
            Cron(
                name=f"bench-{n}",
                schedule=expression,
                task_path="tests.testapp.tasks.noop",
                next_tick_at=Timing(expression).next_after(now + timedelta(hours=1)),
            )
        )
    Cron.objects.bulk_create(rows, batch_size=2000)
    conn.execute("VACUUM ANALYZE conveyor_cron")
    walls: list[float] = []
    for _ in range(passes):
        with conn.cursor() as cursor:
            started = time.perf_counter()
            counts = ticks.run_once(cursor, ticks.database_now(cursor))
            walls.append((time.perf_counter() - started) * 1000)
        assert counts.due == 0, counts
    server: list[float] = []
    plans: dict[str, str] = {}
    for _ in range(passes):
        total = 0.0
        for name, sql, params in (
            ("DUE", ticks.DUE, {"now": now, "limit": ticks.BATCH_SIZE}),
            ("NEXT_TICK", ticks.NEXT_TICK, None),
        ):
            plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()[0]
            total += plan[0]["Execution Time"] + plan[0]["Planning Time"]
            plans[name] = sorted(set(indexes(plan[0]["Plan"])))
        server.append(total)
    conn.close()
    return {
        "schedules": schedules,
        "passes": passes,
        "database_ms": summary(server),
        "pass_wall_ms": summary(walls),
        "plans": plans,
    }


def lateness(seconds: float) -> dict[str, object]:
    from django_conveyor.models import Cron, Job
    from django_conveyor.periodic import ticks
    from django_conveyor.periodic.expressions import Timing
    from django_conveyor.worker.connections import connect

    Cron.objects.all().delete()
    Job.objects.all().delete()
    conn = connect("default")
    now = ticks.database_now(conn.cursor())
    start = now + timedelta(seconds=5)  # the worker is up and idle by then
    Cron.objects.create(
        name="every-second",
        schedule="* * * * * *",
        task_path="tests.testapp.tasks.noop",
        next_tick_at=Timing("* * * * * *").next_after(start),
    )
    log = open(REPO / "var" / "cron-bench-worker.log", "wb")  # noqa: SIM115
    proc = scratch.start_worker(log)
    try:
        time.sleep(5 + seconds)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()
    jobs = Job.objects.filter(idempotency_key__startswith="cron:every-second:")
    late = [(j.enqueued_at - j.run_after).total_seconds() * 1000 for j in jobs]
    instants = sorted(jobs.values_list("run_after", flat=True))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(instants)]
    conn.close()
    return {
        "seconds": seconds,
        "ticks": len(late),
        "every_tick_once": len(instants) >= seconds - 1 and all(g == 1.0 for g in gaps),
        "lateness_ms": summary(late),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    setup_django()
    import django

    from django_conveyor.worker.connections import connect

    with connect("default") as conn:
        server_version = conn.info.server_version
    results = {
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "postgresql": server_version,
        "pass_cost": pass_cost(args.schedules, args.passes),
        "lateness": lateness(args.seconds),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    # Figures are not judged (machines differ); a tick without exactly one job is a bug.
    return 0 if results["lateness"]["every_tick_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
