"""Values PostgreSQL accepts but Python cannot load: refused at every edge, survived in the table.

`'0001-01-01 00:30:00+01'` is year 1 where it was written and 1 BC in UTC;
`infinity` is no datetime at all; a jsonb number of 5,000 digits is past
Python's limit for an int. Nothing django-conveyor offers writes such a
value (each edge refuses it, naming the field, and writes nothing); a row
that holds one anyway (written by hand, by an older version, by a bug)
fails its own job, and every batch, queue, worker and page goes on.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from django_conveyor import protocol
from django_conveyor.api import keys
from django_conveyor.compat import InvalidTask
from django_conveyor.models import Cron, Job
from django_conveyor.periodic import ticks
from django_conveyor.workflows import chain
from tests.helpers import kill_group, start_worker, stop_process, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

PLUS_ONE = timezone(timedelta(hours=1))
# Year 1 where it is written, 1 BC in UTC: PostgreSQL stores it, Python cannot load it.
BEFORE_YEAR_ONE = datetime(1, 1, 1, 0, 30, tzinfo=PLUS_ONE)
UNREPRESENTABLE = [
    pytest.param(BEFORE_YEAR_ONE, id="1-BC-in-UTC"),
    pytest.param(datetime(1, 1, 1, tzinfo=UTC), id="year-1-shown-west-of-UTC-is-year-0"),
    pytest.param(datetime(9999, 12, 31, 23, 30, tzinfo=timezone(-timedelta(hours=1))), id="10000"),
]
BC = "'0001-01-01 00:30+01'"  # SQL: the same instant, 1 BC in UTC.
UNREADABLE_UPDATES = {
    # Column values as SQL: what a hand-written row, an older version or a bug may leave.
    "before year 1": f"run_after = {BC}, enqueued_run_after = {BC}",
    "infinite": "enqueued_at = 'infinity'",
    "minus infinity": "run_after = '-infinity', enqueued_run_after = '-infinity'",
    "a 5,000-digit number": "args = '[1e5000, 2]'::jsonb",
}
UNREADABLE_ROW = "django_conveyor.exceptions.UnreadableRow"


def corrupt(job_id: int, assignments: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE conveyor_job SET {assignments} WHERE id = %s", [job_id])


def http(live_server, method: str, path: str, key: str, body=None):
    request = urllib.request.Request(
        live_server.url + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


class TestTheEdgesRefuse:
    @pytest.mark.parametrize("when", UNREPRESENTABLE)
    def test_python_enqueue_using_and_enqueue_many(self, when):
        with pytest.raises(InvalidTask, match=r"^run_after .* must be an instant between"):
            tasks.add.using(run_after=when)
        task = tasks.add.using(run_after=datetime.now(UTC))
        with pytest.raises(InvalidTask, match="run_after"):
            task.using(run_after=when).enqueue_many([((1, 2), {})])
        with pytest.raises(InvalidTask, match="run_after"):
            chain(tasks.add.step(1, 2), tasks.add.using(run_after=when).step(3, 4)).enqueue()
        assert not Job.objects.exists()

    def test_the_bounds_themselves_are_accepted(self):
        early = datetime(1, 1, 2, tzinfo=UTC)
        result = tasks.add.using(run_after=early).enqueue(1, 2)
        assert Job.objects.get(pk=int(result.id)).run_after == early
        assert tasks.add.get_result(result.id).task.run_after == early

    @pytest.mark.parametrize(
        "value",
        ["0001-01-01T00:30:00+01:00", "0001-01-01T00:00:00Z", "9999-12-31T23:30:00-01:00",
         "infinity", "-infinity"],
    )  # fmt: skip
    def test_the_http_api_answers_400_naming_run_after_and_writes_nothing(self, live_server, value):
        key = keys.create("svc", ["enqueue"])[1]
        body = {"task": "tests.testapp.tasks.add", "args": [1, 2], "run_after": value}
        status, problem = http(live_server, "POST", "/conveyor/api/jobs", key, body)
        assert status == 400, problem
        assert [(e["field"], e["location"]) for e in problem["errors"]] == [("run_after", "body")]
        assert not Job.objects.exists()


@pytest.mark.slow
def test_a_worker_fails_each_unreadable_job_alone_and_serves_the_rest(tmp_path):
    bad = {}
    ordinary = [int(tasks.add.enqueue(i, 1).id) for i in range(24)]
    for name, assignments in UNREADABLE_UPDATES.items():
        job_id = int(tasks.add.enqueue(100, 1).id)
        corrupt(job_id, assignments)
        bad[name] = job_id
    ordinary += [int(tasks.add.enqueue(i, 2).id) for i in range(24)]
    log = tmp_path / "worker.log"
    proc = start_worker("--queues", "default", "--concurrency", "4", log=log)
    try:
        wait_until(
            lambda: (
                Job.objects.filter(pk__in=[*ordinary, *bad.values()])
                .exclude(state__in=["completed", "failed"])
                .count()
                == 0
            ),
            timeout=90,
        )
        done = Job.objects.filter(pk__in=ordinary)
        assert sorted(set(done.values_list("state", "attempt"))) == [("completed", 1)]
        for name, job_id in bad.items():
            (state, errors) = Job.objects.filter(pk=job_id).values_list("state", "errors")[0]
            assert state == "failed", name
            assert errors[-1]["exception_class_path"] == UNREADABLE_ROW, (name, errors)
            assert "cannot load" in errors[-1]["traceback"], (name, errors[-1]["traceback"])
        assert stop_process(proc) == 0
    finally:
        kill_group(proc)
    text = log.read_text()
    assert "control loop error" not in text, text[-3000:]


def test_the_claim_of_the_test_runner_fails_the_row_too(conveyor):
    """django_conveyor.testing runs jobs through CLAIM on Django's cursor: the same path."""
    good = tasks.add.enqueue(1, 2)
    broken = tasks.add.enqueue(3, 4)
    corrupt(int(broken.id), UNREADABLE_UPDATES["before year 1"])
    conveyor.run_jobs()
    assert Job.objects.get(pk=int(good.id)).state == "completed"
    row = Job.objects.get(pk=int(broken.id))
    assert (row.state, row.errors[-1]["exception_class_path"]) == ("failed", UNREADABLE_ROW)


def test_the_clamp_leaves_readable_and_null_timestamps_as_they_are():
    from django.db.models import Max

    result = tasks.add.enqueue(1, 2)
    row = Job.objects.get(pk=int(result.id))
    assert (row.started_at, row.finished_at, row.lease_expires_at) == (None, None, None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT enqueued_at FROM conveyor_job WHERE id = %s", [row.id])
        assert row.enqueued_at == cursor.fetchone()[0]  # To the microsecond.
    assert Job.objects.aggregate(latest=Max("finished_at")) == {"latest": None}
    assert list(Job.objects.values_list("started_at", flat=True)) == [None]


class TestPagesAnswer:
    @pytest.fixture
    def rows(self):
        """A job in each state a page lists, each holding unreadable values."""
        made = {}
        for name, assignments in UNREADABLE_UPDATES.items():
            job_id = int(tasks.add.enqueue(1, 2).id)
            corrupt(job_id, assignments)
            made[f"available, {name}"] = job_id
        done = int(tasks.add.enqueue(1, 2).id)
        corrupt(done, "state = 'completed', finished_at = 'infinity', started_at = '-infinity',"
                      " return_value = '1e5000'::jsonb")  # fmt: skip
        made["completed"] = done
        dead = int(tasks.add.enqueue(1, 2).id)
        corrupt(
            dead,
            "state = 'dead', finished_at = '0001-01-01 00:30:00+01',"
            ' errors = \'[{"attempt": 1e5000, "time": "0000-12-31T23:30:00"}]\'',
        )
        made["dead"] = dead
        running = int(tasks.add.enqueue(1, 2).id)
        corrupt(running, "state = 'running', lease_expires_at = '-infinity',"
                         " cancel_requested_at = 'infinity'")  # fmt: skip
        made["running"] = running
        return made

    def test_the_http_api_lists_and_shows_them(self, live_server, rows):
        key = keys.create("svc", ["read"])[1]
        for path in ("/conveyor/api/jobs", "/conveyor/api/jobs?state=available",
                     "/conveyor/api/jobs?queue=default", "/conveyor/api/queues"):  # fmt: skip
            status, body = http(live_server, "GET", path, key)
            assert status == 200, (path, body)
        for name, job_id in rows.items():
            status, body = http(live_server, "GET", f"/conveyor/api/jobs/{job_id}", key)
            assert status == 200, (name, body)
            assert body["id"] == str(job_id)

    def test_the_admin_pages_and_get_result_show_them(self, client, rows):
        client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
        pages = [
            reverse("admin:conveyor_job_changelist"),
            reverse("admin:conveyor_job_changelist") + "?state=available",
            reverse("admin:conveyor_deadletter_changelist"),
            reverse("admin:conveyor_dashboard_changelist"),
            reverse("admin:conveyor_dashboard_changelist") + "?fragment=1",
            reverse("admin:conveyor_queue_changelist"),
        ]
        pages += [reverse("admin:conveyor_job_change", args=[j]) for j in rows.values()]
        for page in pages:
            assert client.get(page).status_code == 200, page
        for job_id in rows.values():
            assert tasks.add.get_result(str(job_id)).id == str(job_id)

    def test_the_metrics_scrape_counts_them(self, client, rows, settings):
        settings.CONVEYOR = {**settings.CONVEYOR, "METRICS_ALLOWED_ADDRESSES": ["127.0.0.1"]}
        response = client.get("/conveyor/metrics")
        assert response.status_code == 200
        assert b'conveyor_jobs{queue="default",state="available"} 4.0' in response.content


def test_an_unreadable_schedule_stops_alone_and_the_others_tick():
    now = ticks.database_now(connection.cursor())
    # Due at this minute's start: the next tick is a minute after it, past `now`. (A second
    # before `now` made two ticks due whenever `now` fell in a minute's first second.)
    due = now.replace(second=0, microsecond=0)
    for name in ("broken", "fine"):
        Cron.objects.create(name=name, schedule="* * * * *", task_path="tests.testapp.tasks.noop",
                            next_tick_at=due)  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("UPDATE conveyor_cron SET next_tick_at = '-infinity' WHERE name = 'broken'")
        counts = ticks.run_once(cursor, now)
    assert (counts.enqueued, counts.stopped) == (1, 1)
    assert Job.objects.filter(idempotency_key__startswith="cron:fine:").count() == 1
    assert Cron.objects.get(name="broken").next_tick_at is None  # Stopped until fixed.
    assert protocol.cron_key("fine", now).startswith("cron:fine:")
