"""What a claim costs behind ready rows of a queue the worker does not serve.

    python tests/benchmarks/claim_behind.py [--behind 1000000] [--own 20000] [--limit 100]
                                            [--calls 7] [--out DIR]

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_claim_behind_bench`, recreated
each run). `--behind` ready jobs of the queue "other", due an hour ago, sort
ahead of `--own` ready jobs of "default" in claim order (priority, then
run_after, then id). Then CLAIM of `--limit` jobs runs `--calls` times for a
worker of "default" alone and for a worker of "default" and "emails", each
in a transaction rolled back (so every call sees the same rows), on a
connection that prepares statements as the worker's does.

A worker of one queue reads the queue-led claim index from its own rows on;
a worker of several reads the claim index in claim order and filters by
queue, so it passes every row of "other" on each claim. Prints one JSON
document (and writes it to --out). Not a timed test: compare runs of one
machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DB_NAME = "conveyor_claim_behind_bench"
INSERT = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
                          max_attempts, run_after, lease_version, errors, enqueued_at)
SELECT 'tests.testapp.tasks.noop', '[]', '{}', %s, 'default', 0, 'available', 0, 5,
       now() - make_interval(secs => %s), 0, '[]', now()
FROM generate_series(1, %s)
"""


def claim_ms(conn: object, queues: list[str], limit: int, calls: int) -> list[float]:
    from django_conveyor import protocol

    times = []
    for _ in range(calls):
        started = time.perf_counter()
        claimed = protocol.claim(
            conn.cursor(), owner="bench", queues=queues, limit=limit, lease_seconds=30.0
        )
        times.append((time.perf_counter() - started) * 1000)
        conn.rollback()
        assert len(claimed) == limit, f"{queues}: claimed {len(claimed)} of {limit}"
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--behind", type=int, default=1_000_000, help="ready jobs of 'other'")
    parser.add_argument("--own", type=int, default=20_000, help="ready jobs of 'default'")
    parser.add_argument("--limit", type=int, default=100, help="jobs per claim")
    parser.add_argument("--calls", type=int, default=7, help="claims per worker kind")
    parser.add_argument("--out", type=Path, help="folder for claim-behind-<date>.json")
    args = parser.parse_args()

    scratch.setup_django(DB_NAME)
    scratch.recreate(DB_NAME)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_conveyor.worker.connections import connect

    with connect("default") as conn:
        conn.execute(INSERT, ["other", 3600, args.behind])
        conn.execute(INSERT, ["default", 0, args.own])
        conn.execute("VACUUM ANALYZE conveyor_job")
    figures = {}
    with connect("default") as conn:
        conn.autocommit = False
        for queues in (["default"], ["default", "emails"]):
            times = claim_ms(conn, queues, args.limit, args.calls)
            figures[",".join(queues)] = {
                "claim_ms": [round(t, 2) for t in times],
                "median_ms_after_the_first": round(statistics.median(times[1:]), 2),
            }
    scratch.drop(DB_NAME)
    result = {
        "what": "CLAIM behind ready rows of a queue the worker does not serve",
        "date": datetime.now(UTC).date().isoformat(),
        "behind": args.behind,
        "own": args.own,
        "limit": args.limit,
        "workers": figures,
    }
    scratch.report(result, args.out, "claim-behind")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
