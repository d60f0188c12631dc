"""Progress (docs/observability.md#progress): set by the handler, written by the heartbeat.

HEARTBEAT_PROGRESS against the real database: it writes under the token
and refuses a stale one; the heartbeat service writes at most once per beat
however often the handler reported, and a beat with nothing new sends the
plain HEARTBEAT; the handler's call refuses values a job could not show;
and the API returns what was written.
"""

from __future__ import annotations

import math

import pytest

from django_conveyor import protocol
from django_conveyor.context import JobContext
from django_conveyor.models import Job
from django_conveyor.observability.progress import Progress
from django_conveyor.worker.connections import connect
from django_conveyor.worker.holdings import Holdings
from django_conveyor.worker.instrument import Counters
from django_conveyor.worker.services.heartbeat import Heartbeat
from tests.factories import JobFactory
from tests.test_services import OWNER, T0

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def conn():
    with connect("default") as connection:
        yield connection


@pytest.fixture
def holdings():
    return Holdings(OWNER, "default", Counters())


def claim(conn, holdings):
    with conn.cursor() as cur:
        claimed = protocol.claim(cur, owner=OWNER, queues=["default"], limit=10, lease_seconds=30)
    return holdings.take(claimed)


class TestHeartbeatProgress:
    def test_writes_the_progress_with_the_attempt_and_the_database_time(self, conn, holdings):
        JobFactory()
        (attempt,) = claim(conn, holdings)
        report = {"current": 3, "total": 10, "message": "three"}
        with conn.cursor() as cur:
            renewed = protocol.heartbeat_progress(
                cur,
                owner=OWNER,
                held=[(attempt.lease.id, attempt.lease.version, report)],
                lease_seconds=30,
            )
        assert renewed == {attempt.lease.id}
        stored = Job.objects.get(pk=attempt.lease.id).progress
        assert {k: stored[k] for k in report} == report and stored["attempt"] == 1
        progress = Progress.of(stored)
        assert progress.fraction == 0.3 and progress.updated_at is not None

    def test_a_stale_token_writes_nothing_and_renews_nothing(self, conn, holdings):
        JobFactory()
        (attempt,) = claim(conn, holdings)
        Job.objects.filter(pk=attempt.lease.id).update(lease_version=7, lease_owner="worker-z")
        with conn.cursor() as cur:
            renewed = protocol.heartbeat_progress(
                cur,
                owner=OWNER,
                held=[(attempt.lease.id, attempt.lease.version, {"current": 1})],
                lease_seconds=30,
            )
        assert renewed == set() and renewed.locked == frozenset()
        assert Job.objects.get(pk=attempt.lease.id).progress is None

    def test_a_lease_without_new_progress_keeps_the_rows_own(self, conn, holdings):
        JobFactory.create_batch(2)
        first, second = claim(conn, holdings)
        Job.objects.filter(pk=second.lease.id).update(progress={"current": 5})
        with conn.cursor() as cur:
            renewed = protocol.heartbeat_progress(
                cur,
                owner=OWNER,
                held=[
                    (first.lease.id, first.lease.version, {"current": 1}),
                    (second.lease.id, second.lease.version, None),
                ],
                lease_seconds=30,
            )
        assert renewed == {first.lease.id, second.lease.id}
        assert Job.objects.get(pk=first.lease.id).progress["current"] == 1
        assert Job.objects.get(pk=second.lease.id).progress == {"current": 5}


class Statements:
    """Records which protocol statement each heartbeat sent."""

    def __init__(self, monkeypatch):
        self.sent: list[str] = []
        for name in ("heartbeat", "heartbeat_progress"):
            real = getattr(protocol, name)
            monkeypatch.setattr(protocol, name, self.wrap(name, real))

    def wrap(self, name, real):
        def call(*args, **kwargs):
            self.sent.append(name)
            return real(*args, **kwargs)

        return call


def test_many_reports_make_one_write_per_beat_and_a_quiet_beat_stays_plain(
    conn, holdings, monkeypatch
):
    JobFactory()
    (attempt,) = claim(conn, holdings)
    context = JobContext(task_result=None, held=attempt)
    statements = Statements(monkeypatch)
    beat = Heartbeat(holdings, lease_seconds=30)
    for i in range(1, 101):
        context.set_progress(i, total=100)
    with conn.cursor() as cur:
        counts = beat.run_once(cur, T0)
    assert counts.progress_written == 1 and counts.renewed == 1
    first = Job.objects.get(pk=attempt.lease.id).progress
    assert first["current"] == 100
    with conn.cursor() as cur:
        counts = beat.run_once(cur, T0)  # nothing new reported
    assert counts.progress_written == 0
    assert statements.sent == ["heartbeat_progress", "heartbeat"]
    assert Job.objects.get(pk=attempt.lease.id).progress == first  # not rewritten
    context.set_progress(100, total=100, message="done")
    with conn.cursor() as cur:
        beat.run_once(cur, T0)
    assert statements.sent[-1] == "heartbeat_progress"
    assert Job.objects.get(pk=attempt.lease.id).progress["message"] == "done"


def test_a_lost_lease_reports_progress_that_is_never_written(conn, holdings):
    JobFactory()
    (attempt,) = claim(conn, holdings)
    Job.objects.filter(pk=attempt.lease.id).update(lease_version=9, lease_owner="worker-z")
    JobContext(task_result=None, held=attempt).set_progress(1)
    with conn.cursor() as cur:
        counts = Heartbeat(holdings, lease_seconds=30).run_once(cur, T0)
    assert counts.leases_lost == 1 and counts.progress_written == 0
    assert Job.objects.get(pk=attempt.lease.id).progress is None


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (("3",), TypeError, "current must be a number, not str"),
        ((True,), TypeError, "current must be a number, not bool"),
        ((math.nan,), ValueError, "current must be a finite number"),
        ((-1,), ValueError, "current must be 0 or more"),
        ((1, 0), ValueError, "total must be more than 0"),
        ((1, math.inf), ValueError, "total must be a finite number"),
        ((1, None, 5), TypeError, "message must be a string"),
        ((1, None, "x" * 201), ValueError, "at most 200 characters, not 201"),
        ((1, None, "a\x00b"), ValueError, "NUL character"),
    ],
)
def test_set_progress_refuses_what_a_job_could_not_show(args, error, message, holdings):
    context = JobContext(task_result=None, held=holdings_attempt())
    with pytest.raises(error) as caught:
        context.set_progress(*args)
    assert message in str(caught.value)
    assert context.held.progress is None


def holdings_attempt():
    from django_conveyor.worker.attempts import Attempt

    return Attempt(lease=None, database="default")


def test_the_api_returns_the_progress_written(client, settings):
    from django_conveyor.api.keys import create

    job = JobFactory(
        running=True,
        progress={"current": 2, "total": 4, "message": "half", "attempt": 1,
                  "updated_at": "2026-01-01T00:00:00+00:00"},
    )  # fmt: skip
    _, key = create("progress", ["read"])
    response = client.get(f"/conveyor/api/jobs/{job.id}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200
    assert response.json()["progress"] == {
        "current": 2.0,
        "total": 4.0,
        "message": "half",
        "attempt": 1,
        "updated_at": "2026-01-01T00:00:00Z",
    }
    bare = JobFactory()
    response = client.get(f"/conveyor/api/jobs/{bare.id}", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.json()["progress"] is None


def test_the_job_page_shows_the_bar_the_numbers_and_the_message(admin_client):
    job = JobFactory(
        running=True,
        progress={"current": 3, "total": 4, "message": "three of four", "attempt": 1,
                  "updated_at": "2026-01-01T00:00:00+00:00"},
    )  # fmt: skip
    page = admin_client.get(f"/admin/conveyor/job/{job.id}/change/").content.decode()
    assert "<progress class='conveyor-progress' max='100' value='75'>" in page
    assert "3 of 4: three of four" in page and "(attempt 1, 2026-01-01 00:00:00)" in page
    bare = JobFactory()
    page = admin_client.get(f"/admin/conveyor/job/{bare.id}/change/").content.decode()
    assert "none reported" in page
