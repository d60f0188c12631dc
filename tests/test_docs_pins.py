"""Numbers and names the docs state, pinned to the code (issue 9, part 6).

Each test reads the value from the code and the sentence from the page, so
a change to either without the other fails here.
"""

import logging
import re
from pathlib import Path

import pytest
from django.db import connection

from django_conveyor import protocol, testing
from django_conveyor.conf import DEFAULT_REAP_SECONDS
from django_conveyor.worker import claims, shutdown
from django_conveyor.worker.handlers import reporting
from django_conveyor.worker.services import reaper
from django_conveyor.worker.services.base import Now
from django_conveyor.worker.services.reaper import Reaper
from tests.helpers import REPO
from tests.testapp import tasks

DOCS = REPO / "docs"


def text(path: Path) -> str:
    return " ".join(path.read_text().split())  # Line breaks do not matter.


def test_the_claim_ahead_buffer_is_100_ms_per_slot_with_no_floor():
    assert claims.CLAIM_AHEAD_SECONDS == 0.1 and claims.MAX_PREFETCH == 1024
    assert claims.MAX_START_WINDOW == claims.MAX_PREFETCH == 1024
    claimer = claims.Claimer(
        owner="w", queues=["default"], concurrency=4, lease_seconds=30, prefetch=None
    )
    assert claimer.prefetch(None) == 4  # The concurrency, before any job ran.
    assert claimer.prefetch(0.001) == 400  # 4 x 100 ms / 1 ms
    assert claimer.prefetch(1e-6) == 1024
    assert claimer.start_window(1e-6) == 1024
    assert claimer.prefetch(0.5) == 0  # Long jobs: no buffer at all.
    assert "about 100 ms of work per slot" in text(DOCS / "worker.md")
    assert "at most 1,024 (`claims.MAX_PREFETCH`)" in text(DOCS / "worker.md")
    assert "capped at 1,024 (`claims.MAX_START_WINDOW`" in text(DOCS / "worker.md")
    assert "about 100 ms of work per slot, rounded down with no floor" in text(
        DOCS / "configuration.md"
    )


def test_a_repeated_stop_signal_is_the_same_stop_for_2_seconds():
    assert shutdown.REPEAT_GRACE_SECONDS == 2.0
    assert "SIGTERM or SIGINT again within 2 seconds" in text(DOCS / "worker.md")
    assert "repeated more than 2 seconds later" in text(REPO / "README.md")


def test_signals_still_queued_at_exit_get_5_seconds():
    assert reporting.FLUSH_SECONDS == 5.0
    assert "waits up to 5 seconds (`reporting.FLUSH_SECONDS`)" in text(DOCS / "tasks.md")


def test_the_psycopg_floor_is_the_one_the_listener_needs():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.findall(r'"psycopg(?:\[binary\])?>=([\d.]+)"', pyproject) == ["3.2"] * 3
    assert "psycopg 3.2 or newer" in text(DOCS / "installation.md")
    assert "psycopg 3.2 or newer" in text(REPO / "README.md")


@pytest.mark.django_db(databases=["default", "shard"])
def test_context_idempotency_key_names_the_database_of_a_sharded_job():
    main = tasks.report_keys.enqueue()
    shard = tasks.report_keys.using(queue_name="other").enqueue()
    testing.run_jobs()
    keys = {r.id: tasks.report_keys.get_result(r.id).return_value for r in (main, shard)}
    assert keys[main.id]["key"] == f"conveyor-job-{main.id}"
    assert keys[shard.id]["key"] == f"conveyor-job-{shard.id}" and shard.id.startswith("shard:")
    assert keys[shard.id]["effect"] == f"conveyor-job-{shard.id}-charge"
    assert '`"conveyor-job-jobs:42"`' in text(DOCS / "handlers.md")


@pytest.mark.django_db(transaction=True)
def test_job_log_lines_carry_their_fields_as_extras_the_reapers_too(caplog):
    result = tasks.add.enqueue(1, 2)
    with connection.cursor() as cursor:
        (lease,) = protocol.claim(
            cursor, owner="host:1:abc", queues=["default"], limit=1, lease_seconds=0.001
        )
        cursor.execute("SELECT pg_sleep(0.01)")
        with caplog.at_level(logging.WARNING, logger="django_conveyor.worker"):
            assert Reaper().run_once(cursor, Now.read()).reaped == 1
    (record,) = [r for r in caplog.records if "reaped" in r.getMessage()]
    fields = ("job_id", "task", "queue", "attempt", "token", "worker_id")
    assert {f: getattr(record, f) for f in fields} == {
        "job_id": int(result.id),
        "task": "tests.testapp.tasks.add",
        "queue": "default",
        "attempt": 1,
        "token": lease.version,
        "worker_id": "host:1:abc",  # The token's owner, never empty.
    }
    for name in fields:
        assert f"`{name}`" in text(DOCS / "worker.md")


def test_the_reaper_throughput_section_names_the_reapers_batch_and_interval():
    assert reaper.BATCH == 500 and reaper.MAX_BATCHES == 40 and DEFAULT_REAP_SECONDS == 5.0
    page = text(DOCS / "performance.md")
    assert "default `REAP_SECONDS` (5)" in page
    assert "One pass takes all 10,000 back (20 statements of 500" in page
    assert "It stays at 500." in page
    # The plan it explains: REAP reaps across all queues, the running index leads with the queue.
    expired = protocol.REAP.split("UPDATE")[0]
    assert "queue" not in expired and "ORDER BY lease_expires_at" in expired
    assert "The running index now leads with the queue, and REAP reaps across all queues" in page
    # The commands it quotes.
    bench = (REPO / "tests" / "benchmarks" / "reaper.py").read_text()
    for option in ("--live", "--queues", "--finished", "--explain"):
        assert f'"{option}"' in bench and option in page
    designs = (REPO / "tests" / "benchmarks" / "statement_limit.py").read_text()
    assert '"reap-by-expiry"' in designs and "--designs shipped,reap-by-expiry" in page
