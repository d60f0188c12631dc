"""The plans of the hot statements: their cost must follow the batch, not the table.

A claim that sorts every ready row works, and passes every other test, while
the drain slows in proportion to the backlog. These tests read `EXPLAIN` of
the real statements on a table with many ready rows and statistics, in the
states of `conveyor_queue` that have misled the planner before (no rows, an
unpaused row, a paused queue beside a served one), so a plan regression fails
here rather than in a benchmark.
"""

import json

import pytest
from django.db import connection

from django_conveyor import protocol
from django_conveyor.models import Queue

pytestmark = pytest.mark.django_db(transaction=True)

READY_ROWS = 20_000


def fill(n: int, queue: str = "default", age: str = "1 hour") -> None:
    with connection.cursor() as cur:
        cur.execute(
            """
            INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state,
                attempt, max_attempts, run_after, lease_version, errors, enqueued_at)
            SELECT 'tests.testapp.tasks.noop', jsonb_build_array(g), '{}', %s, 'default', 0,
                'available', 0, 5, now() - %s::interval, 0, '[]', now()
            FROM generate_series(1, %s) AS g
            """,
            [queue, age, n],
        )
        cur.execute("ANALYZE conveyor_job")
        cur.execute("ANALYZE conveyor_queue")


def explain(sql: str, params: dict) -> dict:
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (document,) = cur.fetchone()
    if isinstance(document, str):
        document = json.loads(document)
    return document[0]["Plan"]


def nodes(plan: dict, *, init_plans: bool = True) -> list[dict]:
    """The plan's nodes; without `init_plans`, only those feeding `plan`'s own rows."""
    found, todo = [], [plan]
    while todo:
        node = todo.pop()
        found.append(node)
        todo += [
            child
            for child in node.get("Plans", [])
            if init_plans or child.get("Parent Relationship") not in ("InitPlan", "SubPlan")
        ]
    return found


def claim_plan(queues: list[str], limit: int = 50) -> dict:
    params = {"queues": queues, "limit": limit, "owner": "w", "lease": 30.0}
    return explain(protocol.CLAIM, params)


def assert_cost_follows_the_batch(plan: dict) -> None:
    """An ordered scan of a claim index, no full scan, no sort of the table's rows."""
    kinds = [(n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes(plan)]
    claim_indexes = {"conveyor_job_claim_idx", "conveyor_job_claim_queue_idx"}
    assert [k for k in kinds if k[0] == "Index Scan" and k[2] in claim_indexes], kinds
    assert ("Seq Scan", "conveyor_job", None) not in kinds, kinds
    # Sorting the claimed batch is fine; sorting what a scan of the table returns is not.
    for sort in (n for n in nodes(plan) if n["Node Type"] == "Sort"):
        scanned = {n.get("Relation Name") for n in nodes(sort, init_plans=False)}
        assert "conveyor_job" not in scanned, kinds


class TestClaimPlan:
    def test_with_no_queue_rows(self):
        fill(READY_ROWS)
        assert_cost_follows_the_batch(claim_plan(["default"]))

    def test_with_an_unpaused_queue_row(self):
        # One unpaused row with statistics: a per-row anti-join is then
        # estimated to leave one job, and the planner sorts them all.
        Queue.objects.create(name="default", paused=False)
        fill(READY_ROWS)
        assert_cost_follows_the_batch(claim_plan(["default"]))

    def test_with_a_paused_queue_beside_a_served_one(self):
        Queue.objects.create(name="default", paused=False)
        Queue.objects.create(name="emails", paused=True)
        fill(READY_ROWS)
        fill(100, queue="emails")
        assert_cost_follows_the_batch(claim_plan(["default", "emails"]))

    def test_a_large_batch_keeps_the_index(self):
        fill(READY_ROWS)
        assert_cost_follows_the_batch(claim_plan(["default"], limit=1000))

    def test_ready_rows_of_other_queues_ahead_are_not_walked(self):
        # A worker of one queue reads a range of the queue-led claim index.
        fill(READY_ROWS, queue="backlog", age="2 hours")
        fill(1_000)
        plan = claim_plan(["default"])
        assert_cost_follows_the_batch(plan)
        scans = [n for n in nodes(plan) if n.get("Index Name") == "conveyor_job_claim_queue_idx"]
        assert scans and "queue" in scans[0].get("Index Cond", ""), scans


class TestMergedClaimPlan:
    """A worker behind other queues' rows claims from one range of the queue-led index
    per queue (CLAIM_MERGED)."""

    def merged_plan(self, queues: list[str], limit: int = 50) -> dict:
        params = {"queues": queues, "limit": limit, "owner": "w", "lease": 30.0}
        return explain(protocol.claim_merged(len(queues)), params)

    def test_ready_rows_of_other_queues_ahead_are_not_walked(self):
        fill(READY_ROWS, queue="backlog", age="2 hours")
        fill(1_000)
        fill(1_000, queue="emails", age="30 minutes")
        plan = self.merged_plan(["default", "emails"])
        assert_cost_follows_the_batch(plan)
        scans = [n for n in nodes(plan) if n.get("Node Type") == "Index Scan"]
        used = {n.get("Index Name") for n in scans}
        assert "conveyor_job_claim_idx" not in used, used
        ranges = [n for n in scans if n.get("Index Name") == "conveyor_job_claim_queue_idx"]
        assert len(ranges) >= 3, ranges  # Two branches, and the locking range.
        assert all("queue" in n.get("Index Cond", "") for n in ranges), ranges
        assert any(n["Node Type"] == "Merge Append" for n in nodes(plan)), plan

    def test_with_a_paused_queue_beside_a_served_one(self):
        Queue.objects.create(name="default", paused=False)
        Queue.objects.create(name="emails", paused=True)
        fill(READY_ROWS)
        fill(100, queue="emails")
        assert_cost_follows_the_batch(self.merged_plan(["default", "emails"]))


class TestPassedAheadPlan:
    """The claim order service's look reads at most its scan, in claim order."""

    def test_the_look_is_one_bounded_scan_of_the_claim_index(self):
        fill(READY_ROWS, queue="backlog", age="2 hours")
        fill(1_000)
        plan = explain(protocol.PASSED_AHEAD, {"queues": ["default", "emails"], "scan": 500})
        limits = [n for n in nodes(plan) if n["Node Type"] == "Limit"]
        assert limits and limits[0]["Plan Rows"] <= 500, limits
        scans = {n.get("Index Name") for n in nodes(plan) if "Index Name" in n}
        assert "conveyor_job_claim_idx" in scans, scans
        jobs = [n for n in nodes(plan) if n.get("Relation Name") == "conveyor_job"]
        assert jobs and not [n for n in jobs if n["Node Type"] == "Seq Scan"], jobs
        assert not [n for n in nodes(plan) if n["Node Type"] == "Sort"], plan
