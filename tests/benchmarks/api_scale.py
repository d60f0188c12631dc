"""The metrics scrape and the API's job pages at a million finished jobs.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/api_scale.py \
        [--finished 1000000] [--ready 10000] [--out docs/results]

Builds a scratch database `conveyor_scale` on the suite's PostgreSQL (the
embedded one unless DATABASE_URL is set), fills it with finished history
and a ready backlog spread over a few queues and tasks, runs ANALYZE as
autovacuum would, then times:

- a full `/conveyor/metrics` scrape through Django (the median of several);
- each shape of `GET /conveyor/api/jobs` page (with EXPLAIN ANALYZE, so the
  plan shows which index serves it).

Writes `api-scale-<date>.json` to --out and prints a summary. The database
is dropped afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DATABASE = "conveyor_scale"
SHARD = "conveyor_scale_shard"  # the suite's settings shard the queue "other" there

QUEUES = ["default", "emails", "slow", "bulk"]
TASKS = ["tests.testapp.tasks.add", "tests.testapp.tasks.send_email", "tests.testapp.tasks.noop"]
# Of the finished history: most completed, some dead, failed and cancelled.
RARE_TASK = "tests.testapp.tasks.record"
FINISHED_MIX = [("completed", 0.97), ("dead", 0.015), ("failed", 0.005), ("cancelled", 0.01)]

FILL = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
    max_attempts, run_after, lease_version, errors, enqueued_at, started_at, finished_at)
SELECT (%(tasks)s::text[])[1 + i %% %(ntasks)s], '[1, 2]', '{}',
       (%(queues)s::text[])[1 + (i / 7) %% %(nqueues)s], 'default', 0, %(state)s, 1, 3,
       now() - make_interval(secs => %(age)s + i * 0.01), 1, '[]',
       now() - make_interval(secs => %(age)s + i * 0.01),
       CASE WHEN %(finished)s THEN now() - make_interval(secs => %(age)s + i * 0.01) END,
       CASE WHEN %(finished)s THEN now() - make_interval(secs => %(age)s + i * 0.01) END
FROM generate_series(1, %(count)s) AS i
"""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--ready", type=int, default=10_000)
    ap.add_argument("--scrapes", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="Keep the database afterwards.")
    return ap.parse_args()


def fill(finished: int, ready: int) -> float:
    from django.db import connection

    started = time.perf_counter()
    common = {"tasks": TASKS, "ntasks": len(TASKS), "queues": QUEUES, "nqueues": len(QUEUES)}
    with connection.cursor() as cursor:
        for state, share in FINISHED_MIX:
            count = int(finished * share)
            cursor.execute(
                FILL, {**common, "state": state, "count": count, "age": 3600, "finished": True}
            )
        cursor.execute(
            FILL, {**common, "state": "available", "count": ready, "age": 0, "finished": False}
        )
        # A rare queue and a rare task, the hard cases for any index choice.
        rare = {"tasks": [RARE_TASK], "ntasks": 1, "queues": ["rare"], "nqueues": 1}
        cursor.execute(
            FILL, {**rare, "state": "completed", "count": 20, "age": 7200, "finished": True}
        )
        cursor.execute("VACUUM ANALYZE conveyor_job")
    return time.perf_counter() - started


def time_scrapes(count: int) -> dict[str, object]:
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    from django_conveyor.api import keys

    _, raw = keys.create("scale", ["metrics"])
    client = Client()
    timings, samples = [], 0
    for _ in range(count):
        started = time.perf_counter()
        response = client.get("/conveyor/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}")
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200
    families = list(text_string_to_metric_families(response.content.decode()))
    samples = sum(len(f.samples) for f in families)
    jobs = {
        (s.labels["queue"], s.labels["state"]): s.value
        for f in families
        if f.name == "conveyor_jobs"
        for s in f.samples
    }
    return {
        "median_ms": round(statistics.median(timings) * 1000, 1),
        "max_ms": round(max(timings) * 1000, 1),
        "samples": samples,
        "completed_default": jobs.get(("default", "completed")),
        "available_default": jobs.get(("default", "available")),
    }


def explain_pages() -> list[dict[str, object]]:
    from django.db import connection

    from django_conveyor.api import listing

    with connection.cursor() as cursor:
        cursor.execute("SELECT max(id) FROM conveyor_job")
        top = cursor.fetchone()[0]
    shapes = [
        ("no filter", {}),
        ("state=dead", {"state": "dead"}),
        ("state=available", {"state": "available"}),
        ("state=completed", {"state": "completed"}),
        ("queue=emails", {"queue": "emails"}),
        ("state=dead&queue=emails", {"state": "dead", "queue": "emails"}),
        ("state=dead&task=...send_email", {"state": "dead", "task": TASKS[1]}),
        ("task=...send_email", {"task": TASKS[1]}),
        ("queue=rare", {"queue": "rare"}),
        ("state=completed&queue=rare", {"state": "completed", "queue": "rare"}),
        ("state=completed&task=<rare task>", {"state": "completed", "task": RARE_TASK}),
        ("task=<rare task>", {"task": RARE_TASK}),
    ]
    results = []
    for label, filters in shapes:
        for depth, before in (("first page", listing.NO_CURSOR), ("deep page", top // 2)):
            sql, params = listing.query(
                "default",
                state=filters.get("state"),
                queue=filters.get("queue"),
                task=filters.get("task"),
                before=before,
                limit=51,
            )
            timings = []
            for _ in range(2):  # the first run may read from disk; the second from cache
                with connection.cursor() as cursor:
                    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                    plan = cursor.fetchone()[0]
                plan = json.loads(plan) if isinstance(plan, str) else plan
                timings.append(round(plan[0]["Execution Time"], 2))
            results.append(
                {
                    "page": f"{label}, {depth}",
                    "first_ms": timings[0],
                    "warm_ms": timings[1],
                    "indexes": sorted(_indexes(plan[0]["Plan"])),
                }
            )
    return results


def _indexes(node: dict) -> set[str]:
    found = {node["Index Name"]} if "Index Name" in node else set()
    for child in node.get("Plans", []):
        found |= _indexes(child)
    return found


def main() -> int:
    args = parse_args()
    scratch.setup_django(DATABASE, SHARD)
    from django.core.management import call_command

    scratch.recreate(DATABASE, SHARD)
    try:
        call_command("migrate", verbosity=0)
        call_command("migrate", database="shard", verbosity=0)
        fill_seconds = fill(args.finished, args.ready)
        result = {
            "date": dt.date.today().isoformat(),
            "finished_rows": args.finished,
            "ready_rows": args.ready,
            "fill_seconds": round(fill_seconds, 1),
            "scrape": time_scrapes(args.scrapes),
            "pages": explain_pages(),
            "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at end",
        }
    finally:
        if not args.keep:
            scratch.drop(DATABASE, SHARD)
    scratch.report(result, args.out, "api-scale")
    return 0


if __name__ == "__main__":
    sys.exit(main())
