"""What a claim costs behind ready rows of a queue the worker does not serve.

    python tests/benchmarks/claim_behind.py [--behind 1000000] [--own 20000] [--limit 100]
                                            [--calls 7] [--spread 0] [--out DIR]

    python tests/benchmarks/claim_behind.py --out docs/results
    python tests/benchmarks/claim_behind.py --behind 0 --limit 1000 --out docs/results
    python tests/benchmarks/claim_behind.py --behind 0 --spread 100 --out docs/results

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_claim_behind_bench`, recreated
each run). `--behind` ready jobs of the queue "other", due an hour ago, sort
ahead of `--own` ready jobs of "default" and as many of "emails" in claim
order (priority, then run_after, then id). Then CLAIM of `--limit` jobs
runs `--calls` times for a worker of "default" alone and for a worker of
"default" and "emails", each in a transaction rolled back (so every call
sees the same rows), on a connection that prepares statements as the
worker's does.

A worker of one queue reads the queue-led claim index from its own rows on.
CLAIM for several queues reads the claim index in claim order and filters
by queue, so it passes every row of "other" on each claim; the worker sends
CLAIM_MERGED instead while its claim order service sees many such rows
ahead (worker/services/claim_order.py): one ordered range of the
queue-led index per queue, merged, then each queue's share locked, sent as
the worker sends it (unprepared, JIT off). The script runs both for the
worker of two queues and checks that they claim the same jobs in the same
order. `--spread K` adds
`--own` ready jobs spread over K more queues, due first, and a worker of all
K, by CLAIM and by CLAIM_MERGED (what a merge of K branches would cost).
Prints one JSON document (and writes it to --out). Not a timed test:
compare runs of one machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DB_NAME = "conveyor_claim_behind_bench"
MERGED = "(CLAIM_MERGED)"
# `count` ready jobs of the queue {queue} (SQL: a parameter, or an expression
# of the row number g), due `secs` seconds ago.
READY = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
                          max_attempts, run_after, lease_version, errors, enqueued_at)
SELECT 'tests.testapp.tasks.noop', '[]', '{{}}', {queue}, 'default', 0, 'available', 0, 5,
       now() - make_interval(secs => %s), 0, '[]', now()
FROM generate_series(1, %s) AS g
"""
INSERT = READY.format(queue="%s")  # [queue, secs, count]
# --spread K: over the queues s0 ... s(K-1), due before every other job, so
# that nothing of another queue is ahead of them. [K, secs, count]
SPREAD = READY.format(queue="'s' || (g %% %s)")


def claim_ms(
    conn: Any, queues: list[str], limit: int, calls: int, sql: str | None = None
) -> tuple[list[float], list[int]]:
    """Milliseconds of each call, and the ids the last one claimed, in order."""
    from django_conveyor import protocol

    times, ids = [], []
    params = {"queues": queues, "limit": limit, "owner": "bench", "lease": 30.0}
    for _ in range(calls):
        started = time.perf_counter()
        if sql is None:
            rows = conn.execute(protocol.CLAIM, params).fetchall()
        else:  # As the worker sends CLAIM_MERGED (protocol.send_claim).
            conn.execute(protocol.JIT_OFF)
            rows = conn.execute(sql, params, prepare=False).fetchall()
        times.append((time.perf_counter() - started) * 1000)
        conn.rollback()
        assert len(rows) == limit, f"{queues}: claimed {len(rows)} of {limit}"
        ids = [row[0] for row in rows]
    return times, ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--behind", type=int, default=1_000_000, help="ready jobs of 'other'")
    parser.add_argument("--own", type=int, default=20_000, help="ready jobs of 'default'")
    parser.add_argument("--limit", type=int, default=100, help="jobs per claim")
    parser.add_argument("--calls", type=int, default=7, help="claims per worker kind")
    parser.add_argument(
        "--spread", type=int, default=0, help="also K queues of --own ready jobs, one worker of all"
    )
    parser.add_argument("--out", type=Path, help="folder for claim-behind-B-limit-L-<date>.json")
    args = parser.parse_args()

    scratch.setup_django(DB_NAME)
    scratch.recreate(DB_NAME)
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django_conveyor import protocol
    from django_conveyor.worker.connections import connect

    with connect("default") as conn:
        conn.execute(INSERT, ["other", 3600, args.behind])
        conn.execute(INSERT, ["default", 0, args.own])
        conn.execute(INSERT, ["emails", 10, args.own])
        if args.spread:
            conn.execute(SPREAD, [args.spread, 7200, args.own])
        conn.execute("VACUUM ANALYZE conveyor_job")
    two = ["default", "emails"]
    runs = [("default", ["default"], None), ("default,emails", two, None)]
    runs.append((f"default,emails {MERGED}", two, protocol.claim_merged(len(two))))
    if args.spread:
        many = [f"s{i}" for i in range(args.spread)]
        runs.append((f"{args.spread} queues", many, None))
        runs.append((f"{args.spread} queues {MERGED}", many, protocol.claim_merged(len(many))))
    figures, claimed = {}, {}
    with connect("default") as conn:
        conn.autocommit = False
        for name, queues, sql in runs:
            times, claimed[name] = claim_ms(conn, queues, args.limit, args.calls, sql)
            figures[name] = {
                "claim_ms": [round(t, 2) for t in times],
                "median_ms_after_the_first": round(statistics.median(times[1:]), 2),
            }
    for name, _, sql in runs:
        if sql is not None:  # The merged form claims what CLAIM claims, in its order.
            assert claimed[name] == claimed[name.removesuffix(f" {MERGED}")], name
    scratch.drop(DB_NAME)
    result = {
        "what": "CLAIM and CLAIM_MERGED behind ready rows of a queue the worker does not serve",
        "date": datetime.now(UTC).date().isoformat(),
        "behind": args.behind,
        "own": args.own,
        "limit": args.limit,
        "spread": args.spread,
        "workers": figures,
    }
    stem = f"claim-behind-{args.behind}-limit-{args.limit}"
    scratch.report(result, args.out, stem + (f"-spread-{args.spread}" if args.spread else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
