"""Waiting gates cost nothing per worker cycle: claim and drain with 100,000 of them.

    python tests/benchmarks/gates.py [--gates 100000] [--jobs 5000] [--processes 2]
                                     [--concurrency 8] [--rounds 2] [--out FILE.json]

Runs against the tests' PostgreSQL (DATABASE_URL, else the embedded server in
var/), in a database of its own (`conveyor_gates_bench`, recreated each run).
Interleaved rounds, each measured with and without `--gates` waiting gates
(signal gates, a tenth with a deadline a day ahead) in the table:

1. Claim: one CLAIM of an empty queue (nothing ready), then one of a ready
   job, repeated 200 times each; the median milliseconds.
2. Drain: `--jobs` no-op jobs drained by real `conveyor_worker --burst`
   processes, throughput over the span from first claim to last completion.
3. The gates service's pass with nothing due (its two index probes), median ms.
4. With the gates in the table: the shared buffers that CLAIM, GATE_TIMEOUT
   (nothing due) and the condition poll read (EXPLAIN ANALYZE, BUFFERS): a
   count that does not depend on the machine's load.

Prints one JSON document (and writes it to --out). Not a timed test: figures
depend on the machine, so compare with and without gates within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import scratch  # noqa: E402  (beside this script)
import workflows as workflow_bench  # noqa: E402

DB_NAME = "conveyor_gates_bench"
REPEAT = 200

INSERT_GATES = """
INSERT INTO conveyor_job (
    task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts,
    run_after, lease_version, errors, enqueued_at, pending_dependencies, dependency_policy,
    gate, gate_deadline
)
SELECT 'django_conveyor.workflows.gates.signal', '[]', '{}', 'default', 'default', 0,
       'blocked', 0, 1, now(), 0, '[]', now(), 0, 'cancel',
       '{"kind": "signal", "signal": "approval", "on_timeout": "fail"}',
       CASE WHEN g %% 10 = 0 THEN now() + interval '1 day' END
FROM generate_series(1, %(n)s) AS g
"""


def median_ms(fn) -> float:
    times = []
    for _ in range(REPEAT):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def buffers() -> dict[str, int]:
    """Shared buffers each statement reads, from EXPLAIN (ANALYZE, BUFFERS), rolled back."""
    import re

    from django.db import connection, transaction

    from django_conveyor import protocol
    from tests.testapp.tasks import noop

    statements = {
        "claim": (protocol.CLAIM, {"queues": ["default"], "limit": 8, "owner": "x", "lease": 30}),
        "gate_timeout_nothing_due": (protocol.GATE_TIMEOUT, {"limit": 500}),
        "condition_poll": (protocol.WAITING_CONDITIONS, {"after": 0, "limit": 100, "ids": None}),
    }
    read = {}
    with connection.cursor() as cur:
        for name, (sql, params) in statements.items():
            with transaction.atomic():
                noop.enqueue_many([((), {})] * 20)
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + sql, params)
                top = next(r[0] for r in cur.fetchall() if "Buffers:" in r[0])
                transaction.set_rollback(True)
            read[name] = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", top))
    return read


def measure(args) -> dict:
    from django.db import connection, transaction

    from django_conveyor import protocol
    from django_conveyor.worker.services.base import Now
    from django_conveyor.worker.services.gates import GatesService
    from tests.testapp.tasks import noop

    with connection.cursor() as cur:

        def claim_empty():
            with transaction.atomic():
                protocol.claim(cur, owner="bench", queues=["default"], limit=8, lease_seconds=30)

        def claim_one():
            with transaction.atomic():
                noop.enqueue()
                [lease] = protocol.claim(
                    cur, owner="bench", queues=["default"], limit=8, lease_seconds=30
                )
                protocol.complete(cur, owner="bench", done=[(lease.id, lease.version, None)])

        service = GatesService(database="default")
        figures = {
            "claim_empty_ms": median_ms(claim_empty),
            "enqueue_claim_complete_ms": median_ms(claim_one),
            "gates_pass_ms": median_ms(lambda: service.run_once(cur, Now.read())),
        }
    with transaction.atomic():
        plain = noop.enqueue_many([((), {})] * args.jobs)
    wall = workflow_bench.drain(args.processes, args.concurrency)
    figures["drain"] = {**workflow_bench.span([int(r.id) for r in plain]), "wall_s": round(wall, 2)}
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gates", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scratch.setup_django(DB_NAME)
    scratch.recreate(DB_NAME)
    import django
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    (REPO / "var").mkdir(exist_ok=True)
    rounds = []
    for _ in range(args.rounds):
        with connection.cursor() as cur:
            cur.execute("DELETE FROM conveyor_job")
            cur.execute("VACUUM ANALYZE conveyor_job")
        without = measure(args)
        without["buffers"] = buffers()
        with connection.cursor() as cur:
            cur.execute("DELETE FROM conveyor_job")
            cur.execute(INSERT_GATES, {"n": args.gates})
            cur.execute("VACUUM ANALYZE conveyor_job")
        with_gates = measure(args)
        with_gates["buffers"] = buffers()
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM conveyor_job WHERE gate IS NOT NULL")
            waiting = cur.fetchone()[0]
        rounds.append({"without_gates": without, "with_gates": with_gates, "gates": waiting})
    results = {
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "postgresql": connection.cursor().connection.info.server_version,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "jobs": args.jobs,
        "workers": {"processes": args.processes, "concurrency": args.concurrency},
        "rounds": rounds,
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    drained = all(r[k]["drain"]["completed"] == args.jobs for r in rounds
                  for k in ("without_gates", "with_gates"))  # fmt: skip
    return 0 if drained else 1


if __name__ == "__main__":
    sys.exit(main())
