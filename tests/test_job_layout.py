"""The job table's layout (migration 0016): the secondary indexes leave running
rows out, and every read that needs running rows still finds them, through an
index.

The admin's lists, the API's pages and the counts read running jobs apart
(conveyor_job_reap_idx); a list that forgot them would pass every test that
only looks at finished or ready jobs, so these look at running ones.
"""

import json

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from django_conveyor import queue_counts
from django_conveyor.admin.base import JobListPaginator
from django_conveyor.api import keys, listing
from django_conveyor.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

JOBS = reverse("admin:conveyor_job_changelist")
TASK = "tests.testapp.tasks.send_email"
NOT_RUNNING = "WHERE (NOT ((state)::text = 'running'::text))"


def index_definitions() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'conveyor_job'"
        )
        return dict(cursor.fetchall())


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


@pytest.fixture
def mixed():
    """Running and waiting jobs of one queue and task, interleaved by id, and others."""
    ids = []
    for n in range(6):
        trait = {"running": True} if n % 2 else ({"completed": True} if n % 3 else {})
        ids.append(JobFactory(queue="emails", task_path=TASK, **trait).id)
    JobFactory(queue="default", running=True)
    JobFactory(queue="default")
    return sorted(ids, reverse=True)


def test_the_secondary_indexes_leave_running_rows_out():
    found = index_definitions()
    for name in ("conveyor_job_queue_id_idx", "conveyor_job_task_id_idx", "conveyor_job_list_idx"):
        assert found[name].endswith(NOT_RUNNING), found[name]
    assert found["conveyor_job_reap_idx"].endswith(
        "(queue, lease_expires_at) WHERE ((state)::text = 'running'::text)"
    ), found["conveyor_job_reap_idx"]


class TestAdminLists:
    def test_a_queue_filter_lists_its_running_jobs_among_the_others(self, staff, mixed):
        cl = staff.get(JOBS, {"queue": "emails"}).context["cl"]
        assert [job.id for job in cl.result_list] == mixed
        assert cl.result_count == 6

    def test_a_task_filter_lists_its_running_jobs_among_the_others(self, staff, mixed):
        cl = staff.get(JOBS, {"task": TASK}).context["cl"]
        assert [job.id for job in cl.result_list] == mixed

    def test_the_state_filter_running_by_queue(self, staff, mixed):
        cl = staff.get(JOBS, {"queue": "emails", "state": "running"}).context["cl"]
        assert {job.id for job in cl.result_list} == set(
            Job.objects.filter(queue="emails", state="running").values_list("id", flat=True)
        )
        assert all(job.state == "running" for job in cl.result_list)

    def test_pages_walk_both_parts_in_id_order(self, staff, mixed, monkeypatch):
        from django_conveyor.admin.jobs import JobAdmin

        monkeypatch.setattr(JobAdmin, "list_per_page", 4)
        first = staff.get(JOBS, {"queue": "emails"}).context["cl"]
        second = staff.get(JOBS, {"queue": "emails", "p": 2}).context["cl"]
        assert first.multi_page
        assert [j.id for j in first.result_list] + [j.id for j in second.result_list] == mixed
        ascending = staff.get(JOBS, {"queue": "emails", "o": "1"}).context["cl"]
        assert [j.id for j in ascending.result_list] == sorted(mixed)[:4]

    def test_the_estimate_adds_both_parts(self, mixed, monkeypatch):
        from django_conveyor.admin import base

        monkeypatch.setattr(base, "EXACT_COUNT_LIMIT", 2)
        paginator = JobListPaginator(Job.objects.filter(queue="emails").order_by("-id"), 100)
        assert paginator.count >= 6
        assert paginator.estimated


class TestApiPages:
    @pytest.fixture
    def get(self, client):
        headers = {"HTTP_AUTHORIZATION": f"Bearer {keys.create('svc', ['read'])[1]}"}
        return lambda **params: [
            int(j["id"])
            for j in client.get("/conveyor/api/jobs", params, **headers).json()["items"]
        ]

    def test_by_queue_by_task_and_running_alone(self, get, mixed):
        assert get(queue="emails") == mixed
        assert get(task=TASK) == mixed
        running = sorted(Job.objects.filter(state="running").values_list("id", flat=True))
        assert get(state="running") == running[::-1]
        assert get(state="running", queue="emails") == [i for i in mixed if i in running]

    def test_a_search_without_state_or_queue_finds_running_jobs(self, get, mixed):
        assert get(q="send_em") == mixed


def test_the_live_counts_count_running_jobs_per_queue(mixed):
    counts = queue_counts.snapshot()
    assert counts["emails"].jobs["running"] == 3
    assert counts["default"].jobs["running"] == 1
    assert counts["default"].jobs["available"] == 1


def plan_nodes(sql: str, params) -> list[tuple[str, str | None]]:
    """The scans of a plan with sequential scans priced out: a read no index serves shows one."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        (document,) = cursor.fetchone()
    document = json.loads(document) if isinstance(document, str) else document
    found, todo = [], [document[0]["Plan"]]
    while todo:
        node = todo.pop()
        found.append((node["Node Type"], node.get("Index Name")))
        todo += node.get("Plans", [])
    return found


@pytest.mark.django_db(transaction=False)
class TestEveryReadHasAnIndex:
    def assert_indexed(self, sql, params=()):
        scans = plan_nodes(sql, params)
        assert ("Seq Scan", None) not in scans, scans
        return {name for _, name in scans if name}

    def test_the_admin_parts(self, mixed):
        queryset = Job.objects.filter(queue="emails").order_by("-id")
        for part, index in zip(
            JobListPaginator(queryset, 100).parts(),
            ("conveyor_job_queue_id_idx", "conveyor_job_reap_idx"),
            strict=True,
        ):
            sql, params = part[:100].query.sql_with_params()
            assert index in self.assert_indexed(sql, params)
        by_task = JobListPaginator(Job.objects.filter(task_path=TASK).order_by("-id"), 100)
        sql, params = by_task.parts()[0][:100].query.sql_with_params()
        assert "conveyor_job_task_id_idx" in self.assert_indexed(sql, params)

    def test_the_api_pages_and_the_counts(self, mixed):
        for filters in ({"task": TASK}, {"state": "running"}, {"queue": "emails"}):
            merged = {"state": None, "queue": None, "task": None, **filters}
            sql, params = listing.query("default", before=listing.NO_CURSOR, limit=51, **merged)
            self.assert_indexed(sql, params)
        states = [s.value for s in queue_counts.LIVE_STATES]
        self.assert_indexed(queue_counts.COUNT_LIVE, {"states": states})
        running = (
            "SELECT count(*) FROM conveyor_job AS r WHERE r.state = 'running' AND r.queue = %s"
        )
        assert "conveyor_job_reap_idx" in self.assert_indexed(running, ["emails"])
