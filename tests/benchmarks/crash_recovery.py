"""What a crash costs: a worker killed with a full claim-ahead buffer, and the drain after it.

    python tests/benchmarks/crash_recovery.py [--jobs 100000] [--kill-at 0.3]
                                              [--concurrency 10] [--prefetch N]
                                              [--timeout 600] [--out FILE.json]

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_crash_bench`, recreated each run).

`--jobs` no-op jobs are enqueued. Worker A (`conveyor_worker --concurrency N
--lease 2`, and `--prefetch` when given) drains them until `--kill-at` of
them are completed, and is killed with SIGKILL: with jobs this short its
claim-ahead buffer is full, every one of its jobs held. Once their leases
expired, worker B (the same flags, `--burst`) drains the rest, the reaper's
isolated jobs among them, and exits. Then the same number of fresh jobs is
drained by a burst worker with nothing isolated: the baseline.

Figures: what A held when it died, how many jobs REAP isolated (they run
alone once) and gave back unstarted, B's seconds against the baseline's.
Prints one JSON document (and writes it to --out); exits 1 unless every job
ended completed. Not a timed test: compare runs of one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DB_NAME = "conveyor_crash_bench"
LEASE_SECONDS = 2.0  # A's leases expire this soon after its death.
CHUNK = 5000  # Jobs per enqueue_many call.


def setup_django() -> None:
    scratch.setup_django(DB_NAME)
    scratch.recreate(DB_NAME)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def enqueue(n: int) -> None:
    from django.db import connection

    from tests.testapp import tasks

    for lo in range(0, n, CHUNK):
        tasks.noop.enqueue_many([((), {})] * min(CHUNK, n - lo))
    with connection.cursor() as cur:
        cur.execute("ANALYZE conveyor_job")


def counts() -> dict[str, int]:
    from django.db.models import Count

    from django_conveyor.models import Job

    return dict(Job.objects.values_list("state").annotate(n=Count("id")).order_by())


def worker(log: Path, flags: list[str], *extra: str) -> subprocess.Popen[bytes]:
    timing = {
        "LEASE_SECONDS": LEASE_SECONDS,
        "HEARTBEAT_SECONDS": LEASE_SECONDS / 4,
        "REAP_SECONDS": LEASE_SECONDS / 4,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "django", "conveyor_worker", "--queues", "default", "-v", "1",
         *flags, *extra],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO),
             "CONVEYOR_TEST_CONVEYOR_JSON": json.dumps(timing)},
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def burst(log: Path, flags: list[str], timeout: float) -> float:
    started = time.perf_counter()
    proc = worker(log, flags, "--burst")
    try:
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if code != 0:
        raise SystemExit(f"the burst worker exited {code}; see {log}")
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--kill-at", type=float, default=0.3, help="share completed when killed")
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--prefetch", type=int, help="the workers' --prefetch (default: adaptive)")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    flags = ["--concurrency", str(args.concurrency), "--lease", str(LEASE_SECONDS)]
    if args.prefetch is not None:
        flags += ["--prefetch", str(args.prefetch)]
    log = REPO / "var" / "crash-bench-worker.log"
    log.parent.mkdir(exist_ok=True)
    setup_django()
    from django_conveyor.models import Job

    enqueue(args.jobs)
    a = worker(log, flags)
    deadline = time.monotonic() + args.timeout
    while counts().get("completed", 0) < args.kill_at * args.jobs:
        if a.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"worker A stopped or took too long; see {log}")
        time.sleep(0.01)
    os.killpg(a.pid, signal.SIGKILL)
    a.wait()
    at_kill = counts()
    time.sleep(LEASE_SECONDS + 0.5)
    after_seconds = burst(log, flags, args.timeout)
    reaped = Job.objects.exclude(errors=[])
    isolated = reaped.filter(attempt=2).count()  # Charged: it may have started, ran alone.
    unstarted = reaped.filter(attempt=1).count()  # Never listed: its attempt given back.
    final = counts()
    left = args.jobs - at_kill.get("completed", 0)
    Job.objects.all().delete()
    enqueue(left)
    baseline_seconds = burst(log, flags, args.timeout)
    baseline_final = counts()
    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "jobs": args.jobs,
        "flags": flags,
        "at_kill": at_kill,
        "held_at_kill": at_kill.get("running", 0),
        "isolated": isolated,
        "given_back_unstarted": unstarted,
        "left_at_kill": left,
        "after_the_crash_seconds": round(after_seconds, 2),
        "after_the_crash_jobs_per_s": round(left / after_seconds),
        "baseline_seconds": round(baseline_seconds, 2),
        "baseline_jobs_per_s": round(left / baseline_seconds),
        "final_states": final,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    scratch.emit(result, args.out)
    scratch.drop(DB_NAME)
    ok = final == {"completed": args.jobs} and baseline_final == {"completed": left}
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
