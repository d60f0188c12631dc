"""Through a real PgBouncer in transaction mode; `python tests/pgbouncer/run.py` runs these.

That command starts PgBouncer in front of the test PostgreSQL and runs this
file with the enqueue, handler and worker-process tests, once per mode:
`poll-only` (workers never LISTEN) and `listener-dsn` (workers LISTEN on a
direct connection, everything else goes through PgBouncer). Skipped in the
plain suite, which talks to PostgreSQL directly.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from django_conveyor.models import Job
from django_conveyor.worker.connections import connection_params
from tests.helpers import REPO, kill_group, stop_process, wait_until, worker_env
from tests.pgbouncer.bouncer import POOL_MODE, session_state_errors
from tests.testapp import tasks

MODE = os.environ.get("CONVEYOR_TEST_POOLER")
LISTEN_POLL_SECONDS = 60.0  # Long: in listener mode only a NOTIFY can explain a quick pickup.
POLL_ONLY_SECONDS = 2.0
PICKUP_BOUND_SECONDS = 5.0  # Listener mode: far below the poll interval, with room for a busy box.
SAMPLES = 8

pytestmark = [
    pytest.mark.skipif(not MODE, reason="runs behind PgBouncer: python tests/pgbouncer/run.py"),
    pytest.mark.django_db(transaction=True),
]


def pooled(dbname: str | None = None) -> psycopg.Connection:
    """A connection made the way Django's is: through PgBouncer."""
    params = connection_params("default")
    if dbname:
        params["dbname"] = dbname
    return psycopg.connect(**params, autocommit=True, cursor_factory=psycopg.ClientCursor)


def show(what: str) -> list[dict]:
    """PgBouncer's admin console (simple query protocol only)."""
    with pooled("pgbouncer") as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(f"SHOW {what}").fetchall()


def test_the_suite_reaches_postgresql_through_pgbouncer_in_transaction_mode():
    config = {row["key"]: row["value"] for row in show("CONFIG")}
    assert config["pool_mode"] == POOL_MODE == "transaction"
    assert int(connection.settings_dict["PORT"]) == int(config["listen_port"])
    assert connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] is True
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database()")
        name = cursor.fetchone()[0]
    assert any(client["database"] == name for client in show("CLIENTS"))
    if MODE == "poll-only":
        assert settings.CONVEYOR["LISTEN"] is False
    else:
        assert f"dbname={name}" in settings.CONVEYOR["LISTENER_DSN"]


def test_each_client_keeps_its_own_session_settings():
    """PgBouncer carries the time zone Django sets, per client, across server connections."""
    with pooled() as other, pooled() as mine:
        server_default = other.execute("SHOW TimeZone").fetchone()[0]
        mine.execute("SET TIME ZONE 'Pacific/Auckland'")  # session state, on purpose
        for _ in range(20):
            assert mine.execute("SHOW TimeZone").fetchone()[0] == "Pacific/Auckland"
            assert other.execute("SHOW TimeZone").fetchone()[0] == server_default
            with connection.cursor() as cursor:
                cursor.execute("SHOW TimeZone")
                assert cursor.fetchone()[0] == settings.TIME_ZONE  # Django's own SET TIME ZONE


def test_an_idle_worker_picks_up_a_new_job(tmp_path):
    """Pickup = the claim's now() minus the enqueue's now(), both the database's clock."""
    log = tmp_path / "worker.log"
    if MODE == "listener-dsn":
        interval, flags, ready = LISTEN_POLL_SECONDS, [], "listening on channel"
    else:
        interval, flags, ready = POLL_ONLY_SECONDS, ["--poll-only"], "starting: queues="
    env = {**worker_env(), "DJANGO_SETTINGS_MODULE": "tests.pgbouncer.idle_settings"}
    command = [sys.executable, "-m", "django", "conveyor_worker", "-v", "2", "--queues", "default"]
    command += ["--concurrency", "1", "--interval", str(interval), *flags]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(lambda: ready in log.read_text(), timeout=60)
        pickups = []
        for i in range(SAMPLES):
            result = tasks.add.enqueue(i, 1)
            wait_until(lambda r=result: Job.objects.get(pk=r.id).state == "completed", timeout=90)
            row = Job.objects.get(pk=result.id)
            pickups.append((row.started_at - row.enqueued_at).total_seconds())
        assert stop_process(proc) == 0
    finally:
        kill_group(proc)
    report = {
        "mode": MODE,
        "poll_interval_s": interval,
        "samples": len(pickups),
        "median_s": round(statistics.median(pickups), 4),
        "max_s": round(max(pickups), 4),
        "pickups_s": [round(p, 4) for p in pickups],
    }
    if out_dir := os.environ.get("CONVEYOR_TEST_POOLER_OUT"):
        Path(out_dir, "pickup.json").write_text(json.dumps(report, indent=2) + "\n")
    assert not session_state_errors([log])
    if MODE == "listener-dsn":
        assert "poll-only" not in log.read_text()
        assert max(pickups) < PICKUP_BOUND_SECONDS < interval / 10, report
    else:
        assert max(pickups) < interval + PICKUP_BOUND_SECONDS, report
