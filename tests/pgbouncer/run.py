"""Run the tests and a short fault run through a real PgBouncer in transaction mode.

    python tests/pgbouncer/run.py --mode {poll-only,listener-dsn} [--out DIR] [--jobs N]
                                  [--no-faults] [PYTEST_ARGS...]

1. Starts PgBouncer (transaction pooling, its config, auth file and log in
   DIR/<mode>/pgbouncer/) in front of the test PostgreSQL: `DATABASE_URL`
   if set, else the embedded server of `$CONVEYOR_DATA_DIR` (as the suite).
2. Runs the enqueue, handler, worker-process and claim order tests and
   tests/test_pgbouncer.py through it, with Django's connections, the
   workers' and the in-process workers' all on PgBouncer. `poll-only`:
   workers never LISTEN. `listener-dsn`: workers LISTEN on a direct
   connection (`CONVEYOR["LISTENER_DSN"]`), and an idle worker must pick a
   new job up well inside its (long) poll interval.
3. Runs the `kill9` and `pg-restart` fault scenarios with the harness's
   workers behind a PgBouncer of its own (`--pgbouncer MODE`).
4. Fails if any step failed, or if PgBouncer's log or a worker's log names a
   prepared-statement, cursor or startup-parameter error.

Writes DIR/<mode>/summary.json. Exits 0 only if everything passed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODES = ("poll-only", "listener-dsn")
SCENARIOS = ("kill9", "pg-restart")
TEST_DB = "conveyor_test_pgbouncer"
SUITE = [
    "tests/test_enqueue.py",
    "tests/test_handlers.py",
    "tests/test_processes.py",
    "tests/test_claim_order.py",
    "tests/test_enqueue_pieces.py",
    "tests/test_pgbouncer.py",
]


def say(text: str) -> None:
    print(f"pgbouncer: {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--out", type=Path, default=REPO / "var" / "pgbouncer")
    parser.add_argument("--jobs", type=int, default=60, help="Jobs per fault run (default 60).")
    parser.add_argument("--no-faults", action="store_true", help="Run the tests only.")
    parser.add_argument(
        "tests", nargs="*", default=SUITE, help="pytest arguments (default: the suite above)."
    )
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    import psycopg
    import psycopg.errors

    from tests import settings as test_settings
    from tests.pgbouncer.bouncer import PgBouncer, Upstream, session_state_errors, version

    out = (args.out / args.mode).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    upstream = Upstream.from_django(test_settings.DATABASES["default"])
    bouncer = PgBouncer(out / "pgbouncer", upstream)
    summary: dict = {"mode": args.mode, "pgbouncer": ".".join(map(str, version()))}
    failures: list[str] = []

    def drop_test_databases() -> None:
        # Directly, not through PgBouncer, whose pooled connections would block it.
        with psycopg.connect(upstream.conninfo(dbname="postgres"), autocommit=True) as conn:
            for name in (TEST_DB, f"{TEST_DB}_shard"):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    try:
        bouncer.start()
        say(f"PgBouncer {summary['pgbouncer']} on 127.0.0.1:{bouncer.port}, pool_mode=transaction")
        drop_test_databases()
        env = {
            **os.environ,
            "DATABASE_URL": bouncer.url("postgres"),
            "CONVEYOR_TEST_DB": TEST_DB,
            "CONVEYOR_TEST_POOLER": args.mode,
            "CONVEYOR_TEST_DIRECT_DSN": upstream.conninfo(),
            "CONVEYOR_TEST_POOLER_OUT": str(out),
        }
        basetemp = out / "pytest"
        started = time.monotonic()
        say(f"tests through PgBouncer ({args.mode}): {' '.join(args.tests)}")
        # --reuse-db: pytest-django creates the test databases through PgBouncer
        # but leaves them at the end (PgBouncer's idle server connections would
        # block the DROP); they are dropped directly below.
        code = subprocess.call(
            [sys.executable, "-m", "pytest", *args.tests, "-q", "-p", "no:cacheprovider",
             "--reuse-db", f"--basetemp={basetemp}"],
            cwd=REPO, env=env,
        )  # fmt: skip
        summary["tests"] = {"exit_code": code, "seconds": round(time.monotonic() - started, 1)}
        if code != 0:
            failures.append(f"the tests through PgBouncer failed (pytest exit code {code})")
        pickup = out / "pickup.json"
        if pickup.exists():
            summary["pickup"] = json.loads(pickup.read_text())
        else:
            failures.append("the pickup measurement did not run")
        logs = sorted(basetemp.rglob("*.log"))
        summary["worker_logs_scanned"] = len(logs)

        for scenario in () if args.no_faults else SCENARIOS:
            started = time.monotonic()
            say(f"fault run {scenario} ({args.jobs} jobs) behind PgBouncer ({args.mode})")
            keep = out / "faults" / f"logs-{scenario}"
            code = subprocess.call(
                [sys.executable, "tests/faults/run.py", "--scenario", scenario,
                 "--jobs", str(args.jobs), "--out", str(out / "faults"),
                 "--pgbouncer", args.mode, "--keep", str(keep)],
                cwd=REPO,
            )  # fmt: skip
            result_file = out / "faults" / f"fault-{scenario}.json"
            result = json.loads(result_file.read_text()) if result_file.exists() else {}
            summary[f"fault_{scenario}"] = {
                "exit_code": code,
                "seconds": round(time.monotonic() - started, 1),
                **{k: result.get(k) for k in ("jobs", "completed", "lost", "duplicate_effects")},
            }
            if code != 0:
                failures.append(f"the {scenario} fault run behind PgBouncer failed (exit {code})")
            logs += sorted(keep.glob("*.log"))
    finally:
        bouncer.stop()
        try:
            drop_test_databases()
        except psycopg.Error as exc:
            say(f"could not drop the test databases: {exc}")

    logs.append(bouncer.log)
    errors = session_state_errors(logs)
    summary["session_state_errors"] = errors[:20]
    if errors:
        failures.append(f"{len(errors)} session-state error(s) logged, first: {errors[0]}")
    summary["failures"] = failures
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if "pickup" in summary:
        p = summary["pickup"]
        say(
            f"pickup of a new job by an idle worker ({args.mode}, poll interval "
            f"{p['poll_interval_s']}s): median {p['median_s']}s, max {p['max_s']}s "
            f"over {p['samples']} jobs"
        )
    say(f"logs scanned for session-state errors: {len(logs)}, errors: {len(errors)}")
    for failure in failures:
        say(f"FAIL: {failure}")
    say(f"{'passed' if not failures else 'FAILED'}; summary in {out / 'summary.json'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
