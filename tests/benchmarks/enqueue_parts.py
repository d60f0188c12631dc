"""Where one enqueue call's time goes: the call, its statement, and a bare INSERT.

    CONVEYOR_DATA_DIR=var/pg-3.12 .venv-3.12/bin/python tests/benchmarks/enqueue_parts.py \
        [--calls 2000] [--rounds 2] [--out docs/results]

One call per transaction, in one process, on Django's connection in
autocommit, against a scratch database `conveyor_enqueue_parts` on the
suite's PostgreSQL (the embedded one unless DATABASE_URL is set). Each
round times, one after another, `--calls` calls of:

- the floor: `INSERT INTO bench_floor (payload) VALUES (...)`, one index;
- `protocol.enqueue()`: the ENQUEUE statement alone, with and without NOTIFY;
- `task.enqueue()`: validation, the statement and the result;
- the same job row as a plain `INSERT ... VALUES ... RETURNING` into
  conveyor_job (not a code path: what a single-row statement would cost).

Prints calls/s, wall and Python CPU microseconds per call for each, and
writes `enqueue-parts-<date>.json` to --out when given. The database is
dropped afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

import scratch  # noqa: E402  (beside this script)

DATABASE = "conveyor_enqueue_parts"
SHARD = "conveyor_enqueue_parts_shard"

VALUES_INSERT = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
    max_attempts, run_after, lease_version, errors, enqueued_at)
VALUES (%s, %s::jsonb, %s::jsonb, %s, %s, %s, 'available', 0, %s, now(), 0, '[]', now())
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key, enqueued_at, run_after, state, pg_notify('conveyor', queue)
"""


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    return ap.parse_args()


def variants() -> dict[str, Callable[[], None]]:
    from django.db import connection

    from django_conveyor import protocol
    from django_conveyor.compat import task_backends
    from tests.testapp.tasks import noop

    job = task_backends["default"].new_job(noop, (), {})

    def floor() -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_floor (payload) VALUES (%s)", ["[]"])

    def statement(notify: bool) -> Callable[[], None]:
        def call() -> None:
            with connection.cursor() as cursor:
                protocol.enqueue(cursor, [job], notify=notify)

        return call

    def values_insert() -> None:
        row = [job.task_path, json.dumps(job.args), json.dumps(job.kwargs), job.queue]
        row += [job.backend, job.priority, job.max_attempts]
        with connection.cursor() as cursor:
            cursor.execute(VALUES_INSERT, row)
            cursor.fetchall()

    return {
        "floor: bare INSERT, one index": floor,
        "protocol.enqueue(): ENQUEUE alone": statement(True),
        "protocol.enqueue() without NOTIFY": statement(False),
        "task.enqueue(): the whole call": noop.enqueue,
        "plain INSERT ... VALUES of the same row": values_insert,
    }


def measure(calls: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, payload jsonb)")
    results: dict[str, list[dict[str, float]]] = {}
    calls_by_name = variants()
    for _ in range(rounds):
        for name, call in calls_by_name.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                call()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            results.setdefault(name, []).append(
                {
                    "calls_per_s": calls / wall,
                    "wall_us": wall / calls * 1e6,
                    "python_cpu_us": cpu / calls * 1e6,
                }
            )
    return results


def main() -> int:
    args = parse_args()
    with scratch.migrated(DATABASE, SHARD):
        logging.getLogger("django.tasks").setLevel(logging.WARNING)  # as the drain benchmark
        results = measure(args.calls, args.rounds)
    for name, runs in results.items():
        shown = " / ".join(
            f"{r['calls_per_s']:,.0f}/s {r['wall_us']:.0f} µs (CPU {r['python_cpu_us']:.0f})"
            for r in runs
        )
        print(f"{name:42} {shown}", file=sys.stderr)
    scratch.report(
        {"date": dt.date.today().isoformat(), "calls": args.calls, "results": results},
        args.out,
        "enqueue-parts",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
