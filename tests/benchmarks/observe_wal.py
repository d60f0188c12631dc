"""Write-ahead log per job for each way of indexing tags, meta and arguments.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/observe_wal.py \
        [--rows 100000] [--jobs 2000] [--rounds 3] [--out docs/results]

Migrates a scratch database, fills it with --rows finished jobs, then, for
each option in turn (rounds interleaved), sets its indexes up and writes
--jobs jobs one at a time: the INSERT, a claim's UPDATE and a completion's
UPDATE, each its own transaction, as a worker's statements would touch the
row. The figure is `pg_current_wal_insert_lsn()` moved, divided by --jobs:
a count of bytes that does not depend on the machine's load (each
measurement starts after a CHECKPOINT, autovacuum is off for the table;
the median of the rounds is reported).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]

import scratch  # noqa: E402

DATABASE = "conveyor_observe_wal"
SHARD = "conveyor_observe_wal_shard"
TASK = "tests.testapp.tasks.add"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

INSERT = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
    max_attempts, run_after, lease_version, errors, enqueued_at, tags, meta)
VALUES (%s, %s::jsonb, %s::jsonb, 'default', 'default', 0, 'available', 0, 3, now(), 0, '[]',
    now(), %s::jsonb, %s::jsonb)
RETURNING id
"""
CLAIM = """
UPDATE conveyor_job SET state = 'running', attempt = attempt + 1, lease_owner = 'w',
    lease_version = lease_version + 1, lease_expires_at = now(), started_at = now()
WHERE id = %s
"""
COMPLETE = """
UPDATE conveyor_job SET state = 'completed', finished_at = now(), lease_expires_at = NULL
WHERE id = %s
"""
FILL = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
    max_attempts, run_after, lease_version, errors, enqueued_at, finished_at)
SELECT %s, jsonb_build_array('SKU-' || i, i), jsonb_build_object('customer_id', i), 'default',
    'default', 0, 'completed', 1, 3, now(), 1, '[]', now(), now()
FROM generate_series(1, %s) AS i
"""
MIGRATED = ("conveyor_job_tags_idx", "conveyor_job_meta_idx")
WHOLE = [
    "CREATE INDEX bench_tags_whole ON conveyor_job USING gin (tags jsonb_path_ops)",
    "CREATE INDEX bench_meta_whole ON conveyor_job USING gin (meta jsonb_path_ops)",
]
ARGUMENTS = [
    "CREATE INDEX bench_args ON conveyor_job USING gin (args jsonb_path_ops)",
    "CREATE INDEX bench_kwargs ON conveyor_job USING gin (kwargs jsonb_path_ops)",
]
BENCH_INDEXES = ("bench_tags_whole", "bench_meta_whole", "bench_args", "bench_kwargs")


def options() -> dict[str, tuple[bool, list[str], dict | None]]:
    """Name -> (keep the migration's partial indexes, more DDL, the job's meta)."""
    from django_conveyor.observability import search

    add_search_index, _ = search.search_index_sql(TASK, "kwargs.customer_id")
    return {
        "neither tag nor meta index, plain job": (False, [], None),
        "partial GIN indexes (the migration's), plain job": (True, [], None),
        "GIN indexes without the predicate, plain job": (False, WHOLE, None),
        "partial GIN indexes, meta = {traceparent}": (True, [], {"traceparent": TRACEPARENT}),
        "partial + GIN on args and kwargs, plain job": (True, ARGUMENTS, None),
        "partial + one AddSearchIndex, plain job of that task": (True, add_search_index, None),
    }


def arrange(cursor, keep_partial: bool, ddl: list[str]) -> None:
    from django_conveyor.observability import search

    cursor.execute("DROP INDEX IF EXISTS " + ", ".join(BENCH_INDEXES))
    for statement in search.search_index_sql(TASK, "kwargs.customer_id")[1]:
        cursor.execute(statement)
    if keep_partial:
        cursor.execute(
            "CREATE INDEX IF NOT EXISTS conveyor_job_tags_idx ON conveyor_job "
            "USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL"
        )
        cursor.execute(
            "CREATE INDEX IF NOT EXISTS conveyor_job_meta_idx ON conveyor_job "
            "USING gin (meta jsonb_path_ops) WHERE meta IS NOT NULL"
        )
    else:
        cursor.execute("DROP INDEX IF EXISTS " + ", ".join(MIGRATED))
    for statement in ddl:
        cursor.execute(statement)


def wal_per_job(cursor, jobs: int, meta: dict | None) -> float:
    cursor.execute("CHECKPOINT")
    cursor.execute("SELECT pg_current_wal_insert_lsn()")
    (start,) = cursor.fetchone()
    encoded = json.dumps(meta) if meta else None
    for i in range(jobs):
        args, kwargs = json.dumps([f"SKU-{i}", i]), json.dumps({"customer_id": i})
        cursor.execute(INSERT, [TASK, args, kwargs, None, encoded])
        (job,) = cursor.fetchone()
        cursor.execute(CLAIM, [job])
        cursor.execute(COMPLETE, [job])
    cursor.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", [start])
    return float(cursor.fetchone()[0]) / jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    scratch.setup_django(DATABASE, SHARD)
    from django.core.management import call_command
    from django.db import connection

    scratch.recreate(DATABASE, SHARD)
    try:
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute(FILL, [TASK, args.rows])
            cursor.execute("VACUUM ANALYZE conveyor_job")
            # Autovacuum's WAL would be counted too (the LSN is the server's).
            cursor.execute("ALTER TABLE conveyor_job SET (autovacuum_enabled = off)")
        runs: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, (keep_partial, ddl, meta) in options().items():
                with connection.cursor() as cursor:
                    arrange(cursor, keep_partial, ddl)
                    runs.setdefault(name, []).append(round(wal_per_job(cursor, args.jobs, meta)))
                print(name, runs[name][-1], flush=True)
        connection.close()
    finally:
        scratch.drop(DATABASE, SHARD)
    result = {
        "date": dt.date.today().isoformat(),
        "rows": args.rows,
        "jobs": args.jobs,
        "wal_bytes_per_job": {name: statistics.median(r) for name, r in runs.items()},
        "runs": runs,
        "machine": f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at end",
    }
    scratch.report(result, args.out, "observe-wal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
