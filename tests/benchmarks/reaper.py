"""The reaper's figure: how long 10,000 expired leases take to be available again.

    python tests/benchmarks/reaper.py [--jobs 10000] [--live 0] [--queues 1] [--finished 0]
                                      [--reap-seconds S] [--timeout 600] [--explain]
                                      [--out FILE.json]

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_reaper_bench`, recreated each run).

`--jobs` jobs are written `running`, held by a worker that is gone, their
leases expired an hour ago, in a queue no worker serves (so nothing claims
them once they are back). `--live` more running jobs, spread over `--queues`
queues of their own, are held by a worker that is alive (leases that expire
in an hour, which nothing renews or takes back during the run): the running
rows of a busy fleet, which the reaper's statement must pass over.
`--finished` completed jobs in those queues are the table's history. Then one
`conveyor_worker` process starts with the default `REAP_SECONDS`,
`HEARTBEAT_SECONDS` and `POLL_SECONDS` (the tests' settings shorten them),
so its reaper runs at its normal interval, and the script waits until none
of the jobs is running. `--explain` first prints the plan of one REAP
statement of the worker's batch size (EXPLAIN (ANALYZE, BUFFERS), rolled
back); with `--jobs 0` that is the plan of a pass that finds nothing to take
back, which every worker runs every `REAP_SECONDS`.

Figures: the seconds from the worker's start until every job is available
(wall clock, the process's start-up included), the reaper's own span on the
database's clock (from the first job taken back to the last: REAP sets
`run_after` to its statement's `now()`), and how many REAP statements took
jobs back (the distinct `run_after` values). Prints one JSON document (and
writes it to --out) and exits 1 unless every job ended `available`. Not a
timed test: figures depend on the machine, so compare runs of one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DB_NAME = "conveyor_reaper_bench"
QUEUE = "reaped"  # No worker serves it: a job taken back stays available.
POLL_SECONDS = 0.05


def setup_django() -> None:
    scratch.setup_django(DB_NAME)
    scratch.recreate(DB_NAME)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def write_running(
    jobs: int, *, queues: list[str], owner: str, expires: datetime, apart: timedelta = timedelta()
) -> None:
    """Write `jobs` running jobs, spread over `queues`, held by `owner` from `expires` on,
    each lease `apart` after the one before."""
    from django_conveyor.models import Job

    long_ago = datetime.now(UTC) - timedelta(hours=1)
    for lo in range(0, jobs, 2000):
        Job.objects.bulk_create(
            [
                Job(
                    task_path="tests.testapp.tasks.noop",
                    queue=queues[i % len(queues)],
                    state="running",
                    attempt=1,
                    max_attempts=5,
                    lease_owner=owner,
                    lease_version=1,
                    lease_expires_at=expires + i * apart,
                    started_at=long_ago,
                    run_after=long_ago,
                    enqueued_at=long_ago,
                )
                for i in range(lo, min(jobs, lo + 2000))
            ]
        )


def write_finished(jobs: int, queues: list[str]) -> None:
    """Write `jobs` completed jobs, spread over `queues`: the table's history."""
    from django.db import connection

    from django_conveyor.models import Job

    write_running(min(jobs, 1), queues=queues[:1], owner="done", expires=datetime.now(UTC))
    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    made = {
        "queue": f"(ARRAY{queues!r})[1 + mod(i, {len(queues)})]",
        "state": "'completed'",
        "lease_owner": "NULL",
        "lease_expires_at": "NULL",
        "finished_at": "now() - interval '1 day'",
    }
    select = ", ".join(made.get(c, c) for c in columns)
    with connection.cursor() as cur:
        cur.execute(
            f"WITH one AS (DELETE FROM conveyor_job WHERE lease_owner = 'done' RETURNING *) "
            f"INSERT INTO conveyor_job ({', '.join(columns)}) "
            f"SELECT {select} FROM one, generate_series(1, %s) AS i",
            [jobs],
        )


def prepare(jobs: int, live: int, queues: int, finished: int) -> None:
    """The expired leases of a gone worker, the live ones of a worker that holds its jobs,
    and the finished history."""
    from django.db import connection

    now = datetime.now(UTC)
    write_running(jobs, queues=[QUEUE], owner="gone:1:000000", expires=now - timedelta(hours=1))
    held = [f"live-{i}" for i in range(queues)]
    # Each live lease its own expiry (the worst case for the running index's
    # size: equal keys would share one entry); the gone worker's expired
    # together, renewed by its last heartbeat.
    write_running(
        live,
        queues=held,
        owner="alive:1:000000",
        expires=now + timedelta(hours=1),
        apart=timedelta(milliseconds=1),
    )
    write_finished(finished, held)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE conveyor_job")  # Plans from statistics, as on a table in use.


def explain(batch: int) -> list[str]:
    """The plan of one REAP of `batch` rows, executed and rolled back."""
    from django.db import connection, transaction

    from django_conveyor import protocol

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + protocol.REAP, {"limit": batch})
        plan = [row[0] for row in cur.fetchall()]
        transaction.set_rollback(True)
    with connection.cursor() as cur:
        cur.execute("VACUUM conveyor_job")  # Not the rolled-back versions for the worker to pass.
    return plan


def running() -> int:
    from django_conveyor.models import Job

    return Job.objects.filter(queue=QUEUE, state="running").count()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--live", type=int, default=0, help="running jobs of a live worker")
    parser.add_argument("--queues", type=int, default=1, help="queues of the live jobs")
    parser.add_argument("--finished", type=int, default=0, help="completed jobs (history)")
    parser.add_argument("--explain", action="store_true", help="print the plan of one REAP")
    parser.add_argument(
        "--reap-seconds", type=float, help="the worker's REAP_SECONDS (default: the setting's)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait at most")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    setup_django()
    prepare(args.jobs, args.live, args.queues, args.finished)
    from django.db.models import Count, Max, Min

    from django_conveyor.conf import ConveyorSettings
    from django_conveyor.models import Job
    from django_conveyor.worker.services.reaper import BATCH

    if args.explain:
        print("\n".join(explain(BATCH)))

    timing = {
        name: getattr(ConveyorSettings, name).default
        for name in ("REAP_SECONDS", "HEARTBEAT_SECONDS", "POLL_SECONDS")
    }
    if args.reap_seconds is not None:
        timing["REAP_SECONDS"] = args.reap_seconds
    log_path = REPO / "var" / "reaper-bench-worker.log"
    log_path.parent.mkdir(exist_ok=True)
    with open(log_path, "ab") as log:
        started = time.perf_counter()
        worker = scratch.start_worker(log, CONVEYOR_TEST_CONVEYOR_JSON=json.dumps(timing))
        try:
            left = args.jobs
            while left and time.perf_counter() - started < args.timeout:
                if worker.poll() is not None:
                    raise SystemExit(f"the worker exited {worker.returncode}; see {log_path}")
                time.sleep(POLL_SECONDS)
                left = running()
            wall = time.perf_counter() - started
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
    row = Job.objects.filter(queue=QUEUE).aggregate(
        first=Min("run_after"), last=Max("run_after"), statements=Count("run_after", distinct=True)
    )
    states = dict(
        Job.objects.filter(queue=QUEUE).values_list("state").annotate(n=Count("id")).order_by()
    )
    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "jobs": args.jobs,
        "live": args.live,
        "live_queues": args.queues,
        "finished": args.finished,
        "worker_settings": timing,
        "states": states,
        "seconds_until_all_available": round(wall, 3),
        "reaper_span_seconds": (
            round((row["last"] - row["first"]).total_seconds(), 3) if args.jobs else None
        ),
        "reap_statements": row["statements"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    scratch.emit(result, args.out)
    scratch.drop(DB_NAME)
    return 0 if states == ({"available": args.jobs} if args.jobs else {}) else 1


if __name__ == "__main__":
    raise SystemExit(main())
