"""CLAIM_MERGED is another text of CLAIM: the same jobs, in the same order, under the same guard.

Both forms run on the same rows, each in a transaction rolled back, so each
sees what the other saw; the rows mix queues, priorities, due times, an
isolated job, a job not due yet, a paused queue and a row another
transaction holds locked.
"""

from __future__ import annotations

import pytest
from django.db import connection

from django_conveyor import protocol
from django_conveyor.models import Queue
from django_conveyor.worker.connections import connect

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = """
INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state, attempt,
                          max_attempts, run_after, lease_version, errors, enqueued_at, isolated)
SELECT 'tests.testapp.tasks.noop', jsonb_build_array(g), '{}',
       (ARRAY['default', 'emails', 'slow', 'other'])[1 + g %% 4], 'default',
       (g * 7) %% 5 - 2, 'available', 0, 5,
       now() - make_interval(secs => (g * 13) %% 600)
             + make_interval(secs => CASE WHEN g %% 50 = 0 THEN 3600 ELSE 0 END),
       0, '[]', now(), g %% 97 = 0
FROM generate_series(1, %s) AS g
"""


def claimed_ids(conn, sql: str, queues: list[str], limit: int) -> list[int]:
    params = {"queues": queues, "limit": limit, "owner": "w", "lease": 30.0}
    with conn.transaction(force_rollback=True):
        return [row[0] for row in conn.execute(sql, params).fetchall()]


@pytest.fixture
def rows():
    with connection.cursor() as cur:
        cur.execute(ROWS, [2000])
        cur.execute("ANALYZE conveyor_job")


@pytest.mark.parametrize("queues", [["default", "emails"], ["emails", "slow", "default"]])
@pytest.mark.parametrize("limit", [1, 37, 500, 5000])
def test_the_merged_form_claims_what_claim_claims(rows, queues, limit):
    with connect("default") as conn:
        expected = claimed_ids(conn, protocol.CLAIM, queues, limit)
        got = claimed_ids(conn, protocol.claim_merged(len(queues)), queues, limit)
    assert expected, "nothing to claim: the rows no longer test anything"
    assert got == expected


def test_a_paused_queue_and_a_locked_row_are_passed_alike(rows):
    Queue.objects.create(name="emails", paused=True)
    queues = ["default", "emails", "slow"]
    with connect("default") as holder, connect("default") as conn:
        first = claimed_ids(conn, protocol.CLAIM, queues, 1)
        holder.execute("BEGIN")
        holder.execute("SELECT id FROM conveyor_job WHERE id = %s FOR UPDATE", first)
        expected = claimed_ids(conn, protocol.CLAIM, queues, 300)
        got = claimed_ids(conn, protocol.claim_merged(len(queues)), queues, 300)
        holder.execute("ROLLBACK")
    assert first[0] not in got and len(got) == 300
    assert got == expected
    with connection.cursor() as cur:
        cur.execute("SELECT DISTINCT queue FROM conveyor_job WHERE id = ANY(%s)", [got])
        assert {q for (q,) in cur.fetchall()} == {"default", "slow"}


def test_a_claim_changes_the_rows_it_took_alike(rows):
    """Not only the ids: the merged form writes the lease each claimed row gets."""
    queues = ["default", "emails"]
    params = {"queues": queues, "limit": 20, "owner": "w-merged", "lease": 30.0}
    with connect("default") as conn, conn.transaction():
        leases = protocol.claimed_leases(conn.execute(protocol.claim_merged(2), params))
    assert len(leases) == 20
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM conveyor_job WHERE lease_owner = 'w-merged'"
            " AND state = 'running' AND attempt = 1 AND lease_version = 1"
            " AND lease_expires_at > now() AND id = ANY(%s)",
            [[lease.id for lease in leases]],
        )
        assert cur.fetchone()[0] == 20
