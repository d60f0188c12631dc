"""A worker of several queues claims past other queues' backlogs (services/claim_order.py).

CLAIM passes every ready row of a queue it does not claim that sorts ahead of
its own; the claim order service counts them in a bounded look and, past
MERGE_AT, routes the claimer to CLAIM_MERGED, which claims the same jobs
from each queue's own range (tests/test_claim_forms.py checks the sameness).
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_conveyor import protocol
from django_conveyor.models import Queue
from django_conveyor.worker.claims import Claimer, ClaimStep
from django_conveyor.worker.connections import connect
from django_conveyor.worker.services.base import Now
from django_conveyor.worker.services.claim_order import (
    MERGE_AT,
    SCAN_ROWS,
    UNMERGE_BELOW,
    ClaimOrderService,
)
from tests.helpers import start_worker, stop_process, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def ready(n: int, queue: str, age: str, priority: int = 0) -> None:
    """`n` jobs of `queue`, due `age` ago (older sorts ahead in claim order; a negative
    age is a job not due yet)."""
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state,
                attempt, max_attempts, run_after, lease_version, errors, enqueued_at)
            SELECT 'tests.testapp.tasks.noop', '[]', '{}', %s, 'default', %s,
                'available', 0, 5, now() - %s::interval + g * interval '1 microsecond', 0, '[]',
                now()
            FROM generate_series(1, %s) AS g
            """,
            [queue, priority, age, n],
        )
        cur.execute("ANALYZE conveyor_job")


def keep_ready(queue: str, n: int) -> None:
    """Leave the first `n` ready jobs of `queue` in claim order, delete the rest."""
    with connection.cursor() as cur:
        cur.execute(
            """DELETE FROM conveyor_job WHERE queue = %s AND id NOT IN (
                   SELECT id FROM conveyor_job WHERE queue = %s
                   ORDER BY priority DESC, run_after, id LIMIT %s)""",
            [queue, queue, n],
        )


def claimer(*queues: str) -> Claimer:
    return Claimer(owner="w", queues=queues, concurrency=4, lease_seconds=30.0, prefetch=None)


def look(service: ClaimOrderService) -> bool:
    with connect("default") as conn, conn.cursor() as cursor:
        service.run_once(cursor, Now.read())
    return service.claimer.behind


def test_the_claimer_merges_behind_a_backlog_and_returns_once_it_is_gone():
    ready(MERGE_AT + 2_000, "other", "2 hours")
    ready(500, "default", "1 hour")
    service = ClaimOrderService(claimer("default", "emails"))
    assert look(service) is True
    assert service.claimer.merged is True
    keep_ready("other", (MERGE_AT + UNMERGE_BELOW) // 2)
    assert look(service) is True  # Between the two marks: no flapping.
    keep_ready("other", UNMERGE_BELOW - 1_000)
    assert look(service) is False
    assert service.claimer.merged is False


def test_a_backlog_behind_the_workers_own_jobs_is_not_passed():
    ready(SCAN_ROWS, "default", "3 hours")  # The worker's own jobs fill the whole look.
    ready(MERGE_AT * 2, "other", "2 hours")
    assert look(ClaimOrderService(claimer("default", "emails"))) is False


def test_rows_of_other_queues_not_due_yet_count_as_passed_too():
    """CLAIM passes them in the index (its filter reads each); CLAIM_MERGED never meets them."""
    ready(MERGE_AT + 1_000, "other", "-1 day", priority=5)
    ready(100, "default", "1 hour")
    assert look(ClaimOrderService(claimer("default", "emails"))) is True


def test_a_paused_queue_of_the_worker_counts_as_passed():
    Queue.objects.create(name="emails", paused=True)
    ready(MERGE_AT + 1_000, "emails", "2 hours")
    ready(100, "default", "1 hour")
    assert look(ClaimOrderService(claimer("default", "emails"))) is True


def test_a_worker_of_one_queue_or_of_many_never_merges():
    ready(MERGE_AT + 1_000, "other", "2 hours")
    assert look(ClaimOrderService(claimer("default"))) is False
    many = [f"q{i}" for i in range(protocol.MERGED_CLAIM_QUEUES + 1)]
    assert look(ClaimOrderService(claimer(*many))) is False


def test_a_merged_claim_is_two_statements_and_turns_jit_off_for_its_transaction_only():
    ready(50, "default", "1 hour")
    merged = claimer("default", "emails")
    merged.behind = True
    assert merged.statements([ClaimStep(protocol.claim, 10)]) == 2
    assert claimer("default", "emails").statements([ClaimStep(protocol.claim, 10)]) == 1
    with connect("default") as conn:
        with conn.transaction(force_rollback=True), conn.cursor() as cur:
            leases = merged.claim(cur, [ClaimStep(protocol.claim, 10)])
            assert cur.execute("SELECT current_setting('jit')").fetchone() == ("off",)
        assert len(leases) == 10
        assert conn.execute("SELECT current_setting('jit')").fetchone() == ("on",)


def test_a_worker_of_two_queues_drains_its_jobs_behind_another_queues_backlog(tmp_path):
    ready(MERGE_AT * 2 + 5_000, "other", "2 hours")
    log = tmp_path / "worker.log"
    proc = start_worker("--queues", "default,emails", "--concurrency", "4", log=log)
    try:
        wait_until(lambda: "CLAIM_MERGED" in log.read_text(), timeout=30)
        ready(300, "default", "1 hour")
        ready(300, "emails", "90 minutes")
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM conveyor_job WHERE queue <> 'other'")
            assert cur.fetchone()[0] == 600

        def done() -> int:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM conveyor_job"
                    " WHERE queue IN ('default', 'emails') AND state = 'completed'"
                )
                return cur.fetchone()[0]

        wait_until(lambda: done() == 600, timeout=60)
    finally:
        assert stop_process(proc) == 0
    with connection.cursor() as cur:
        cur.execute("SELECT state, count(*) FROM conveyor_job WHERE queue = 'other' GROUP BY state")
        assert cur.fetchall() == [("available", MERGE_AT * 2 + 5_000)]
