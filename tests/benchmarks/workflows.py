"""Workflow figures: a 10,000-child fan-out with one fan-in callback.

    python tests/benchmarks/workflows.py [--children 10000] [--processes 2]
                                         [--concurrency 8] [--out FILE.json]

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_workflow_bench`, recreated each run).

1. Enqueue: `fan_in([noop.step() for each child], noop.step())`, in one
   transaction, timed from the call to the commit (seconds), next to
   `enqueue_many` of as many plain jobs.
2. Drain: real `conveyor_worker --burst` processes drain the plain jobs,
   then the workflow; throughput is jobs over the span from the first claim
   to the last completion (the database's clock), so start-up is left out.
3. Fan-in delay: the callback's claim minus its last child's completion
   (seconds), the cost of the unblocking path end to end.

Prints one JSON document (and writes it to --out); exits 1 only if a job did
not complete or the callback ran before a child completed. Not a timed test:
figures depend on the machine, so take them from a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DB_NAME = "conveyor_workflow_bench"
NOOP = "tests.testapp.tasks.noop"


def setup_django() -> None:
    scratch.setup_django(DB_NAME)
    scratch.recreate(DB_NAME)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drain(processes: int, concurrency: int) -> float:
    """Run burst workers until nothing is ready or held; their wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    with open(REPO / "var" / "workflow-bench-worker.log", "ab") as log:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "django",
                "conveyor_worker",
                "--queues",
                "default",
                "--burst",
                "--processes",
                str(processes),
                "--concurrency",
                str(concurrency),
                "-v",
                "1",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=3600,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"the worker exited {proc.returncode}; see var/workflow-bench-worker.log")
    return time.perf_counter() - started


def span(ids: list[int]) -> dict[str, float | int]:
    from django.db.models import Count, Max, Min, Q

    from django_conveyor.models import Job

    row = Job.objects.filter(pk__in=ids).aggregate(
        first=Min("started_at"),
        last=Max("finished_at"),
        completed=Count("id", filter=Q(state="completed")),
    )
    seconds = (row["last"] - row["first"]).total_seconds()
    return {
        "jobs": len(ids),
        "completed": row["completed"],
        "span_s": round(seconds, 3),
        "jobs_per_s": round(len(ids) / seconds, 1) if seconds > 0 else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    setup_django()
    import django
    from django.db import connection, transaction

    from django_conveyor.models import Job
    from django_conveyor.workflows import fan_in
    from tests.testapp.tasks import noop

    (REPO / "var").mkdir(exist_ok=True)
    started = time.perf_counter()
    with transaction.atomic():
        plain = noop.enqueue_many([((), {})] * args.children)
    plain_enqueue = time.perf_counter() - started
    plain_wall = drain(args.processes, args.concurrency)
    plain_ids = [int(r.id) for r in plain]

    started = time.perf_counter()
    with transaction.atomic():
        workflow = fan_in([noop.step() for _ in range(args.children)], noop.step()).enqueue()
    workflow_enqueue = time.perf_counter() - started
    workflow_wall = drain(args.processes, args.concurrency)
    ids = [int(r.id) for r in workflow]
    callback = Job.objects.get(pk=ids[-1])
    last_child = Job.objects.filter(pk__in=ids[:-1]).order_by("-finished_at").first()
    delay = (callback.started_at - last_child.finished_at).total_seconds()
    results = {
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "postgresql": connection.cursor().connection.info.server_version,
        "cpus": os.cpu_count(),
        "children": args.children,
        "workers": {"processes": args.processes, "concurrency": args.concurrency},
        "enqueue_s": {
            "fan_out_with_fan_in": round(workflow_enqueue, 3),
            "plain_enqueue_many": round(plain_enqueue, 3),
        },
        "drain": {
            "workflow": {**span(ids), "wall_s": round(workflow_wall, 2)},
            "plain": {**span(plain_ids), "wall_s": round(plain_wall, 2)},
        },
        "fan_in_delay_s": round(delay, 4),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    complete = all(results["drain"][k]["completed"] == results["drain"][k]["jobs"]
                   for k in ("workflow", "plain"))  # fmt: skip
    if not complete:
        print("workflow benchmark: not every job completed", file=sys.stderr)
        return 1
    # The delay may be a little below zero, and that is no fault: started_at is
    # the start of the claiming worker's transaction (now()), which may have
    # begun before the transaction that completed the last child committed.
    return 0


if __name__ == "__main__":
    sys.exit(main())
