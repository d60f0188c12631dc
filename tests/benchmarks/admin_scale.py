"""The admin console at scale: server time of its pages over a large conveyor_job.

    python tests/benchmarks/admin_scale.py                  # 10^6 finished, 10^4 ready
    python tests/benchmarks/admin_scale.py --finished 100000 --repeat 5
    python tests/benchmarks/admin_scale.py --rebuild        # build the data set again

Builds (once; reused while its size is unchanged) a database of its own,
`conveyor_admin_bench` on the tests' PostgreSQL (DATABASE_URL, or the
embedded server): finished jobs spread over the last 24 hours (97% completed,
2% dead, 0.5% failed, 0.5% cancelled, with realistic arguments and three
tracebacks per dead job), ready jobs, a few running ones and a few workers.
Then it requests each page through Django's full stack (middleware, admin,
templates) as a superuser, in-process, and prints the median, 95th
percentile and maximum server time of each, and its number of SQL queries.
Not a test: the figures go into docs/admin.md from a quiet run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.benchmarks.admin_settings")
os.environ.setdefault("CONVEYOR_DATA_DIR", str(REPO / "var" / "pg-admin-bench"))

TARGET_MS = 300.0
FINISHED_SHARES = (("completed", 0.97), ("dead", 0.02), ("failed", 0.005), ("cancelled", 0.005))

BUILD = """
INSERT INTO conveyor_job (
    task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts, run_after,
    lease_owner, lease_version, errors, return_value, enqueued_at, started_at, finished_at, history
)
SELECT (%(tasks)s::text[])[1 + g %% array_length(%(tasks)s::text[], 1)],
       jsonb_build_array(g, 'customer-' || (g %% 5000), repeat('x', 120)),
       jsonb_build_object('order', g, 'note', 'benchmark row ' || g),
       (%(queues)s::text[])[1 + (g / 7) %% array_length(%(queues)s::text[], 1)],
       'default', 0, %(state)s, %(attempt)s, 3, t - interval '1 second',
       %(owner)s, %(attempt)s,
       CASE WHEN %(state)s IN ('dead', 'failed') THEN (
           SELECT jsonb_agg(jsonb_build_object(
               'attempt', n, 'worker', 'bench-worker', 'token', n, 'time', t, 'started_at', t,
               'exception_class_path', 'builtins.ConnectionError',
               'traceback', 'Traceback (most recent call last):'
                   || repeat(E'\\n  File "x.py"', 60)))
           FROM generate_series(1, %(attempt)s) AS n)
       ELSE '[]'::jsonb END,
       CASE WHEN %(state)s = 'completed' THEN jsonb_build_object('ok', true, 'id', g) END,
       t - interval '2 seconds', t - interval '1 second', t, '[]'::jsonb
FROM (
    SELECT g, now() - random() * interval '24 hours' AS t
    FROM generate_series(1, %(count)s) AS g
) AS rows
"""

BUILD_LIVE = """
INSERT INTO conveyor_job (
    task_path, args, kwargs, queue, backend, priority, state, attempt, max_attempts, run_after,
    lease_owner, lease_version, lease_expires_at, errors, enqueued_at, started_at, history
)
SELECT (%(tasks)s::text[])[1 + g %% array_length(%(tasks)s::text[], 1)],
       jsonb_build_array(g, repeat('y', 120)), '{}'::jsonb,
       (%(queues)s::text[])[1 + g %% array_length(%(queues)s::text[], 1)],
       'default', 0, %(state)s, %(attempt)s, 3,
       now() - random() * interval '10 minutes' + %(delay)s * interval '1 hour',
       %(owner)s, %(attempt)s, %(expires)s, '[]'::jsonb,
       now() - interval '10 minutes', CASE WHEN %(state)s = 'running' THEN now() END, '[]'::jsonb
FROM generate_series(1, %(count)s) AS g
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=15, help="Timed requests per page.")
    parser.add_argument(
        "--rebuild", action="store_true", help="Drop the database and build the data set again."
    )
    return parser.parse_args()


def ensure_database(rebuild: bool) -> None:
    import psycopg
    from django.conf import settings

    db = settings.DATABASES["default"]
    with psycopg.connect(
        dbname="postgres",
        user=db["USER"],
        host=db["HOST"],
        port=db["PORT"] or None,
        password=db["PASSWORD"] or None,
        autocommit=True,
    ) as conn:
        if rebuild:
            conn.execute(f'DROP DATABASE IF EXISTS "{db["NAME"]}" WITH (FORCE)')
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]])
        if not exists.fetchone():
            conn.execute(f'CREATE DATABASE "{db["NAME"]}"')


def build(finished: int, ready: int, rebuild: bool) -> None:
    from django.core.management import call_command
    from django.db import connection

    from django_conveyor.tasks import known_task_paths
    from tests.benchmarks.admin_settings import QUEUES

    call_command("migrate", verbosity=0)
    label = f"admin-bench finished={finished} ready={ready}"
    with connection.cursor() as cur:
        cur.execute("SELECT obj_description('conveyor_job'::regclass, 'pg_class')")
        if cur.fetchone()[0] == label and not rebuild:
            print(f"reusing the data set ({label})")
            return
        print(f"building the data set ({label}) ...", flush=True)
        started = time.monotonic()
        cur.execute(
            "TRUNCATE conveyor_job, conveyor_job_log, conveyor_ledger, conveyor_dependency,"
            " conveyor_worker"
        )
        tasks, common = known_task_paths(), {"queues": QUEUES}
        for state, share in FINISHED_SHARES:
            attempt = 3 if state == "dead" else 1
            owner = "bench-worker" if state == "completed" else None
            cur.execute(BUILD, {**common, "tasks": tasks, "state": state, "attempt": attempt,
                                "owner": owner, "count": int(finished * share)})  # fmt: skip
        for state, count, delay in (("available", ready, 0), ("available", ready // 10, 1),
                                    ("running", 50, 0)):  # fmt: skip
            running = state == "running"
            cur.execute(BUILD_LIVE, {**common, "tasks": tasks, "state": state, "count": count,
                                     "delay": delay, "attempt": 1 if running else 0,
                                     "owner": "bench-worker" if running else None,
                                     "expires": "infinity" if running else None})  # fmt: skip
        cur.execute(
            "INSERT INTO conveyor_worker (id, host, pid, queues, concurrency, started_at,"
            " last_seen_at, leases_held, version) SELECT 'bench-worker-' || g, 'host-' || g,"
            " 1000 + g, %s::jsonb, 8, now() - interval '1 hour', now(), 6, '0.1.0'"
            " FROM generate_series(1, 8) AS g",
            ['["default", "emails"]'],
        )
        cur.execute(f"COMMENT ON TABLE conveyor_job IS '{label}'")
    with connection.cursor() as cur:
        connection.connection.autocommit = True
        cur.execute("VACUUM ANALYZE conveyor_job")
    print(f"built in {time.monotonic() - started:.0f}s", flush=True)


def pages() -> list[tuple[str, str]]:
    from django.db import connection
    from django.urls import reverse

    with connection.cursor() as cur:
        cur.execute("SELECT id FROM conveyor_job WHERE state = 'dead' ORDER BY id DESC LIMIT 1")
        dead_id = cur.fetchone()[0]
        cur.execute("SELECT id FROM conveyor_job WHERE state = 'completed' LIMIT 1")
        done_id = cur.fetchone()[0]
    jobs = reverse("admin:conveyor_job_changelist")
    dead = reverse("admin:conveyor_deadletter_changelist")
    dashboard = reverse("admin:conveyor_dashboard_changelist")
    return [
        ("job list", jobs),
        ("job list, state=completed", f"{jobs}?state=completed"),
        ("job list, state=available", f"{jobs}?state=available"),
        ("job list, queue=emails", f"{jobs}?queue=emails"),
        ("job list, task filter", f"{jobs}?task=tests.testapp.tasks.send_email"),
        ("job list, page 50", f"{jobs}?p=50"),
        ("job list, search by id", f"{jobs}?q={dead_id}"),
        ("dead letters", dead),
        ("dead letters, queue=emails", f"{dead}?queue=emails"),
        ("dashboard", dashboard),
        ("dashboard refresh (fragment)", f"{dashboard}?fragment=1"),
        ("job page, dead job", reverse("admin:conveyor_job_change", args=[dead_id])),
        ("job page, completed job", reverse("admin:conveyor_job_change", args=[done_id])),
        ("queues", reverse("admin:conveyor_queue_changelist")),
        ("workers", reverse("admin:conveyor_worker_changelist")),
    ]


def measure(repeat: int) -> bool:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    user = User.objects.filter(username="bench").first() or User.objects.create_superuser(
        "bench", "bench@example.com", "bench"
    )
    client = Client()
    client.force_login(user)
    ok = True
    print(f"\n{'page':<32} {'median':>8} {'p95':>8} {'max':>8} {'queries':>8}")
    for name, url in pages():
        for _ in range(2):  # Warm the caches and the plan.
            assert client.get(url).status_code == 200, url
        queries: list[str] = []

        def count(run, sql, *rest, seen=queries):
            seen.append(sql)
            return run(sql, *rest)

        with connection.execute_wrapper(count):
            client.get(url)
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, url
        times.sort()
        p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
        median = statistics.median(times)
        ok &= median < TARGET_MS
        flag = "" if median < TARGET_MS else "  over target"
        print(f"{name:<32} {median:>6.1f}ms {p95:>6.1f}ms {times[-1]:>6.1f}ms "
              f"{len(queries):>8}{flag}")  # fmt: skip
    return ok


def main() -> int:
    args = parse_args()
    import django

    from django_conveyor import embedded  # noqa: F401  (starts the server through settings)

    ensure_database_first(args.rebuild)
    django.setup()
    from django.db import connection

    build(args.finished, args.ready, args.rebuild)
    with connection.cursor() as cur:
        cur.execute("SELECT version(), pg_size_pretty(pg_total_relation_size('conveyor_job'))")
        version, size = cur.fetchone()
        cur.execute("SELECT state, count(*) FROM conveyor_job GROUP BY state ORDER BY state")
        counts = ", ".join(f"{n} {s}" for s, n in cur.fetchall())
    print(f"{version.split(',')[0]}; conveyor_job {size}: {counts}")
    print(f"{os.cpu_count()} cores; {args.repeat} timed requests per page; target {TARGET_MS:g} ms")
    ok = measure(args.repeat)
    print("\nevery page's median under the target" if ok else "\nsome pages over the target")
    return 0 if ok else 1


def ensure_database_first(rebuild: bool) -> None:
    from django.conf import settings

    settings.DATABASES  # noqa: B018  (evaluates the settings, starting the embedded server)
    ensure_database(rebuild)


if __name__ == "__main__":
    sys.exit(main())
