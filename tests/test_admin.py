"""The admin console, driven through Django's test client.

Each action, permission and confirmation path, asserting the rows, the
job's own history and Django's LogEntry.
"""

import datetime as dt

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_conveyor import operations, queue_counts
from django_conveyor.admin import base
from django_conveyor.models import Job, Queue, Worker
from tests.factories import JobFactory, LedgerEntryFactory
from tests.helpers import run_burst

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

JOBS = reverse("admin:conveyor_job_changelist")
DEAD_LETTERS = reverse("admin:conveyor_deadletter_changelist")
QUEUES = reverse("admin:conveyor_queue_changelist")
DASHBOARD = reverse("admin:conveyor_dashboard_changelist")
WORKERS = reverse("admin:conveyor_worker_changelist")


def job_page(job):
    return reverse("admin:conveyor_job_change", args=[job.id])


def row(job):
    return Job.objects.get(pk=job.id)


@pytest.fixture
def staff(client):
    user = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def login_with(client):
    """A staff user holding only the given conveyor permissions."""

    def login(*codenames):
        user = User.objects.create_user("limited", "l@example.com", "pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label="conveyor", codename__in=codenames)
        )
        client.force_login(user)
        return client

    return login


def act(client, url, action, ids, *, confirm, **extra):
    data = {"action": action, "_selected_action": [str(i) for i in ids], **extra}
    if confirm:
        data["post"] = "yes"
    return client.post(url, data, follow=True)


def log_messages(job):
    return list(
        LogEntry.objects.filter(object_id=str(job.id)).values_list("change_message", flat=True)
    )


class TestRequeue:
    def test_the_first_post_only_shows_the_count_and_a_sample(self, staff):
        dead = JobFactory(dead=True)
        response = act(staff, DEAD_LETTERS, "requeue_jobs", [dead.id], confirm=False)
        body = response.content.decode()
        assert "Are you sure you want to requeue 1 job(s)?" in body
        assert 'data-count="1"' in body
        assert f'href="{job_page(dead)}"' in body  # the sample
        assert row(dead).state == "dead"
        assert not LogEntry.objects.exists()

    def test_confirming_requeues_logs_and_records_history(self, staff):
        dead = JobFactory(dead=True)
        response = act(staff, DEAD_LETTERS, "requeue_jobs", [dead.id], confirm=True)
        assert "Requeued 1 job(s)." in response.content.decode()
        assert row(dead).state == "available"
        [entry] = LogEntry.objects.all()
        assert (entry.object_id, entry.action_flag, entry.user.username) == (
            str(dead.id),
            CHANGE,
            "ops",
        )
        assert entry.change_message == "Requeued."
        assert entry.content_type.model == "job"
        [history] = row(dead).history
        assert (history["actor"], history["action"], history["detail"]) == (
            "admin:ops",
            "requeue",
            "was dead",
        )
        run_burst()
        job = row(dead)
        assert (job.state, job.return_value, len(job.errors)) == ("completed", 3, 3)

    def test_jobs_in_other_states_are_skipped_and_said_so(self, staff):
        done, dead = JobFactory(completed=True), JobFactory(dead=True)
        confirm = act(staff, JOBS, "requeue_jobs", [done.id, dead.id], confirm=False)
        body = confirm.content.decode()
        assert "1 selected job cannot be requeued in its state" in body
        assert "This will requeue" in body
        response = act(staff, JOBS, "requeue_jobs", [done.id, dead.id], confirm=True)
        assert "Skipped 1 job(s) that were not failed, dead or cancelled." in (
            response.content.decode()
        )
        assert (row(done).state, row(dead).state) == ("completed", "available")
        assert log_messages(done) == []

    def test_nothing_requeueable_says_so_and_offers_no_button(self, staff):
        done = JobFactory(completed=True)
        body = act(staff, JOBS, "requeue_jobs", [done.id], confirm=False).content.decode()
        assert "nothing was changed" in body
        assert "conveyor-confirm-yes" not in body

    def test_select_all_requeues_every_match_of_the_filter_in_batches(self, staff, monkeypatch):
        monkeypatch.setattr(operations, "BATCH_SIZE", 4)
        batches = []
        real = operations.requeue
        monkeypatch.setattr(
            operations, "requeue", lambda ids, **kw: batches.append(len(ids)) or real(ids, **kw)
        )
        emails = JobFactory.create_batch(10, dead=True, queue="emails")
        other = JobFactory(dead=True, queue="default")
        url = f"{DEAD_LETTERS}?queue=emails"
        page = staff.get(url, {"queue": "emails"})
        assert page.context["cl"].result_count == 10
        confirm = act(staff, url, "requeue_jobs", [emails[0].id], confirm=False, select_across="1")
        assert 'data-count="10"' in confirm.content.decode()
        response = act(staff, url, "requeue_jobs", [emails[0].id], confirm=True, select_across="1")
        assert "Requeued 10 job(s)." in response.content.decode()
        assert batches == [4, 4, 2]
        assert Job.objects.filter(queue="emails", state="available").count() == 10
        assert row(other).state == "dead"
        assert LogEntry.objects.count() == 10

    def test_the_job_page_button_goes_through_the_confirmation(self, staff):
        dead = JobFactory(dead=True)
        url = reverse("admin:conveyor_job_requeue", args=[dead.id])
        assert f'href="{url}"' in staff.get(job_page(dead)).content.decode()
        confirm = staff.get(url)
        assert "Are you sure you want to requeue 1 job(s)?" in confirm.content.decode()
        assert row(dead).state == "dead"
        response = staff.post(url, {"post": "yes"})
        assert response.status_code == 302 and response["Location"] == job_page(dead)
        assert row(dead).state == "available"
        assert log_messages(dead) == ["Requeued."]
        page = staff.get(job_page(dead)).content.decode()
        assert "admin:ops" in page and "was dead" in page  # the history on the job page


class TestCancel:
    def test_cancels_waiting_jobs_and_asks_workers_about_running_ones(self, staff):
        waiting, running, done = JobFactory(), JobFactory(running=True), JobFactory(completed=True)
        ids = [waiting.id, running.id, done.id]
        confirm = act(staff, JOBS, "cancel_jobs", ids, confirm=False)
        assert "Are you sure you want to cancel 2 job(s)?" in confirm.content.decode()
        body = act(staff, JOBS, "cancel_jobs", ids, confirm=True).content.decode()
        assert "Cancelled 1 job(s)." in body
        assert "Asked the workers holding 1 running job(s) to cancel them." in body
        assert "Skipped 1 job(s)" in body
        assert row(waiting).state == "cancelled"
        after = row(running)
        assert (after.state, after.cancel_requested_by) == ("running", "admin:ops")
        assert log_messages(waiting) == ["Cancelled."]
        assert log_messages(running) == ["Cancel requested (running)."]
        assert log_messages(done) == []
        assert "cancel requested" in staff.get(JOBS).content.decode()

    def test_the_job_page_asks_the_worker_to_stop_a_running_job(self, staff):
        running = JobFactory(running=True)
        page = staff.get(job_page(running)).content.decode()
        assert "Cancel (ask the worker)" in page
        url = reverse("admin:conveyor_job_cancel", args=[running.id])
        staff.post(url, {"post": "yes"})
        after = row(running)
        assert after.cancel_requested_at is not None
        page = staff.get(job_page(running)).content.decode()
        assert "by admin:ops" in page
        assert "Cancel (ask the worker)" not in page  # asked once
        assert "running, cancel requested" in page

    def test_a_finished_job_has_neither_button(self, staff):
        done = JobFactory(completed=True)
        page = staff.get(job_page(done)).content.decode()
        assert "conveyor-requeue" not in page and "conveyor-cancel" not in page


class TestPermissions:
    def test_view_only_staff_see_but_cannot_act(self, login_with):
        client = login_with("view_job", "view_deadletter", "view_queue")
        dead = JobFactory(dead=True, args=["secret-token"])
        listing = client.get(DEAD_LETTERS)
        assert listing.status_code == 200
        assert "requeue_jobs" not in listing.content.decode()
        act(client, DEAD_LETTERS, "requeue_jobs", [dead.id], confirm=True)
        assert row(dead).state == "dead"
        page = client.get(job_page(dead))
        assert page.status_code == 200
        assert "conveyor-requeue" not in page.content.decode()
        url = reverse("admin:conveyor_job_requeue", args=[dead.id])
        assert client.get(url).status_code == 403
        assert client.post(url, {"post": "yes"}).status_code == 403
        assert row(dead).state == "dead"
        assert not LogEntry.objects.exists()
        queues = client.get(QUEUES).content.decode()
        assert "pause_queues" not in queues

    def test_payloads_and_tracebacks_need_their_own_permission(self, login_with):
        dead = JobFactory(dead=True, args=["secret-token"])
        client = login_with("view_job")
        body = client.get(job_page(dead)).content.decode()
        assert "secret-token" not in body
        assert "Traceback: boom" not in body
        assert "builtins.ValueError" in body  # the outcome stays visible
        assert "Hidden: arguments, return values and tracebacks" in body

    def test_view_payloads_shows_them_as_json(self, login_with):
        dead = JobFactory(dead=True, args=["secret-token"], kwargs={"to": "a@b.c"})
        client = login_with("view_job", "view_payloads")
        body = client.get(job_page(dead)).content.decode()
        assert "secret-token" in body and "Traceback: boom 3" in body
        assert "&quot;to&quot;: &quot;a@b.c&quot;" in body  # indented JSON, escaped

    @pytest.mark.parametrize("perms", [("view_job", "operate"), ("change_job",)])
    def test_operate_or_change_permission_may_act(self, login_with, perms):
        client = login_with(*perms)
        dead = JobFactory(dead=True)
        act(client, JOBS, "requeue_jobs", [dead.id], confirm=True)
        assert row(dead).state == "available"
        assert log_messages(dead) == ["Requeued."]
        assert row(dead).history[0]["actor"] == "admin:limited"

    def test_operate_lets_staff_pause_queues(self, login_with):
        client = login_with("view_queue", "operate")
        client.get(QUEUES)
        act(client, QUEUES, "pause_queues", ["emails"], confirm=True)
        assert Queue.objects.get(name="emails").paused
        assert LogEntry.objects.get().change_message == "Paused."

    def test_no_form_can_rewrite_a_job(self, staff):
        job = JobFactory()
        response = staff.post(job_page(job), {"state": "completed", "attempt": "9", "_save": "1"})
        assert response.status_code == 403
        assert (row(job).state, row(job).attempt) == ("available", 0)
        assert 'name="_save"' not in staff.get(job_page(job)).content.decode()
        assert staff.get(reverse("admin:conveyor_job_add")).status_code == 403
        delete = reverse("admin:conveyor_job_delete", args=[job.id])
        assert staff.post(delete, {"post": "yes"}).status_code == 403
        assert Job.objects.filter(pk=job.id).exists()

    def test_anonymous_users_are_sent_to_login(self, client):
        for url in (JOBS, DASHBOARD, WORKERS):
            response = client.get(url)
            assert response.status_code == 302 and "/login/" in response["Location"]


class TestJobPage:
    def test_shows_each_attempt_its_worker_and_the_ledger(self, staff):
        dead = JobFactory(dead=True)
        entry = LedgerEntryFactory(job=dead, effect_key="charge-1")
        body = staff.get(job_page(dead)).content.decode()
        assert body.count('class="conveyor-attempt"') == 3
        for n in (1, 2, 3):
            assert f"Traceback: boom {n}" in body
        assert "dead: attempts used up" in body and "raised: retried" in body
        assert entry.effect_key in body

    def test_a_running_job_links_the_worker_that_holds_it(self, staff):
        now = timezone.now()
        Worker.objects.create(
            id="worker-a", host="h", pid=1, queues=["default"], concurrency=4,
            started_at=now, last_seen_at=now, leases_held=1, version="0.1.0",
        )  # fmt: skip
        running = JobFactory(running=True)
        body = staff.get(job_page(running)).content.decode()
        assert reverse("admin:conveyor_worker_change", args=["worker-a"]) in body
        assert "held by" in body and "(live)" in body

    def test_a_completed_job_shows_its_attempt_and_return_value(self, staff):
        done = JobFactory(completed=True, return_value={"total": 3})
        body = staff.get(job_page(done)).content.decode()
        assert "completed by worker-a (not registered)" in body
        assert "&quot;total&quot;: 3" in body


class TestQueuesPage:
    def test_counts_failed_and_dead_and_marks_running_queues_neutrally(self, staff):
        JobFactory.create_batch(2, queue="emails")
        JobFactory(queue="emails", run_after=timezone.now() + dt.timedelta(hours=1))
        JobFactory(queue="emails", dead=True)
        JobFactory(queue="emails", failed=True)
        JobFactory(queue="emails", running=True)
        response = staff.get(QUEUES)
        [emails] = [q for q in response.context["cl"].result_list if q.name == "emails"]
        assert (emails.counts.ready, emails.counts.scheduled, emails.counts.running) == (2, 1, 1)
        assert (emails.counts.failed, emails.counts.dead) == (1, 1)
        body = response.content.decode()
        assert "conveyor-running" in body and "icon-no" not in body

    def test_pause_and_resume(self, staff):
        staff.get(QUEUES)
        act(staff, QUEUES, "pause_queues", ["emails"], confirm=True)
        assert Queue.objects.get(name="emails").paused is True
        assert "conveyor-paused" in staff.get(QUEUES).content.decode()
        act(staff, QUEUES, "resume_queues", ["emails"], confirm=True)
        assert Queue.objects.get(name="emails").paused is False

    def test_a_queue_name_is_not_editable_once_created(self, staff):
        staff.get(QUEUES)
        url = reverse("admin:conveyor_queue_change", args=["emails"])
        assert 'name="name"' not in staff.get(url).content.decode()
        staff.post(url, {"name": "renamed"})
        assert Queue.objects.filter(name="emails").exists()
        assert not Queue.objects.filter(name="renamed").exists()


class TestDashboard:
    def test_numbers_per_queue(self, staff):
        JobFactory.create_batch(3, queue="emails")
        JobFactory(queue="emails", run_after=timezone.now() + dt.timedelta(minutes=5))
        JobFactory(queue="default", running=True)
        JobFactory(queue="default", dead=True)
        JobFactory(queue="default", failed=True)
        JobFactory.create_batch(4, queue="default", completed=True)
        JobFactory(
            queue="default", completed=True, finished_at=timezone.now() - dt.timedelta(hours=2)
        )
        operations.pause(["emails"])
        response = staff.get(DASHBOARD)
        assert response.status_code == 200
        by_name = {q.name: q for q, _ in response.context["rows"]}
        emails, default = by_name["emails"], by_name["default"]
        assert (emails.ready, emails.scheduled, emails.paused) == (3, 1, True)
        assert emails.lag_seconds is not None and emails.lag_seconds >= 0
        assert (default.running, default.dead, default.failed) == (1, 1, 1)
        assert default.completed_last_hour == 4  # not the one two hours ago
        assert default.per_minute[-1] == 4
        body = response.content.decode()
        assert "<svg" in body and "conveyor/dashboard.js" in body
        assert 'data-stat="ready">3<' in body

    def test_dead_letters_past_the_exact_limit_are_estimates_and_say_so(self, staff, monkeypatch):
        monkeypatch.setattr(queue_counts, "EXACT_BELOW", 2)
        JobFactory.create_batch(5, queue="default", dead=True)
        JobFactory(queue="default", failed=True)
        connection.cursor().execute("ANALYZE conveyor_job")
        response = staff.get(DASHBOARD)
        default = {q.name: q for q, _ in response.context["rows"]}["default"]
        assert default.estimated == {"dead"}
        assert default.failed_display == "1"
        assert default.dead_display.startswith("≈")
        assert 'data-stat="dead">≈' in response.content.decode()
        queues = staff.get(QUEUES).content.decode()
        assert "≈" in queues

    def test_the_fragment_is_the_body_alone(self, staff):
        JobFactory()
        response = staff.get(DASHBOARD, {"fragment": "1"})
        body = response.content.decode()
        assert 'id="conveyor-queues"' in body
        assert "<html" not in body

    def test_counts_live_and_lost_workers(self, staff):
        now = timezone.now()
        common = {"host": "h", "pid": 1, "queues": ["default"], "concurrency": 1,
                  "started_at": now, "version": "0.1.0"}  # fmt: skip
        Worker.objects.create(id="live", last_seen_at=now, **common)
        Worker.objects.create(id="lost", last_seen_at=now - dt.timedelta(minutes=5), **common)
        Worker.objects.create(id="stopped", last_seen_at=now, stopped_at=now, **common)
        overview = staff.get(DASHBOARD).context["overview"]
        assert (overview.workers_live, overview.workers_lost) == (1, 1)

    def test_view_only_staff_see_it(self, login_with):
        assert login_with("view_job").get(DASHBOARD).status_code == 200

    def test_staff_without_conveyor_permissions_do_not(self, login_with):
        assert login_with().get(DASHBOARD).status_code == 403


class TestWorkersPage:
    def test_lists_live_lost_and_stopped_workers(self, staff):
        now = timezone.now()
        common = {"host": "h", "pid": 1, "queues": ["default", "emails"], "concurrency": 1,
                  "started_at": now, "version": "0.1.0"}  # fmt: skip
        Worker.objects.create(id="w-live", last_seen_at=now, leases_held=2, **common)
        Worker.objects.create(id="w-lost", last_seen_at=now - dt.timedelta(minutes=5), **common)
        body = staff.get(WORKERS).content.decode()
        assert "conveyor-worker-live" in body and "conveyor-worker-lost" in body
        assert "default, emails" in body
        lost = staff.get(WORKERS, {"status": "lost"}).context["cl"].result_list
        assert [w.id for w in lost] == ["w-lost"]
        Worker.objects.create(id="w-done", last_seen_at=now, stopped_at=now, **common)

        def listed(**params):
            return {w.id for w in staff.get(WORKERS, params).context["cl"].result_list}

        # A clean exit leaves the live-and-lost list at once, and is kept on request.
        assert listed() == {"w-live", "w-lost"}
        assert "live and lost" in staff.get(WORKERS).content.decode()
        assert listed(status="stopped") == {"w-done"}
        assert listed(status="all") == {"w-live", "w-lost", "w-done"}
        assert staff.get(reverse("admin:conveyor_worker_add")).status_code == 403

    def test_a_worker_links_the_jobs_it_holds(self, staff):
        JobFactory(running=True, lease_owner="w-1")
        JobFactory(running=True, lease_owner="w-2")
        held = staff.get(JOBS, {"worker": "w-1"}).context["cl"].result_list
        assert [j.lease_owner for j in held] == ["w-1"]

    def test_each_job_of_the_list_shows_the_worker_holding_it(self, staff):
        JobFactory(running=True, lease_owner="web_1A:7:ab")
        body = staff.get(JOBS).content.decode()
        url = reverse("admin:conveyor_worker_change", args=[quote("web_1A:7:ab")])
        assert f"<a href='{url}' title='holds its lease'>web_1A:7:ab</a>" in body


class TestAtScale:
    """The shape of the list queries; the timings are in the benchmark."""

    def test_lists_fetch_no_payloads_and_scan_nothing_whole(self, staff):
        JobFactory.create_batch(3, dead=True)
        for url in (JOBS, DEAD_LETTERS, f"{JOBS}?queue=default", f"{JOBS}?task=x.y"):
            with CaptureQueriesContext(connection) as queries:
                assert staff.get(url).status_code == 200
            job_queries = [q["sql"] for q in queries if "conveyor_job" in q["sql"]]
            assert job_queries
            for sql in job_queries:
                assert '"conveyor_job"."args"' not in sql
                assert '"conveyor_job"."errors"' not in sql
                assert '"conveyor_job"."return_value"' not in sql
                assert "DISTINCT" not in sql.upper()
                if "COUNT(" in sql.upper():
                    assert "LIMIT" in sql.upper()  # a bounded count

    def test_large_counts_are_estimates_and_say_so(self, staff, monkeypatch):
        monkeypatch.setattr(base, "EXACT_COUNT_LIMIT", 5)
        JobFactory.create_batch(8)
        connection.cursor().execute("ANALYZE conveyor_job")
        response = staff.get(JOBS)
        assert response.context["cl"].paginator.estimated
        assert "(an estimate)" in response.content.decode()
        small = staff.get(JOBS, {"state": "dead"})
        assert not small.context["cl"].paginator.estimated

    def test_search_by_id_key_or_part_of_a_task_path(self, staff):
        a = JobFactory(idempotency_key="order-7")
        b = JobFactory(task_path="tests.testapp.tasks.send_email")
        found = lambda q: {j.id for j in staff.get(JOBS, {"q": q}).context["cl"].result_list}  # noqa: E731
        assert found(str(a.id)) == {a.id}
        assert found("order-7") == {a.id}
        assert found("send_em") == {b.id}

    def test_filters_by_state_queue_and_task(self, staff):
        JobFactory(queue="emails", task_path="tests.testapp.tasks.send_email")
        JobFactory(dead=True)
        assert staff.get(JOBS, {"state": "dead"}).context["cl"].result_count == 1
        assert staff.get(JOBS, {"queue": "emails"}).context["cl"].result_count == 1
        task = "tests.testapp.tasks.send_email"
        assert staff.get(JOBS, {"task": task}).context["cl"].result_count == 1
        choices = staff.get(JOBS).content.decode()
        assert "send_email (tests.testapp.tasks)" in choices  # from the task registry


def test_api_keys_are_listed_without_their_hash_and_can_be_revoked(staff):
    from django_conveyor.api import keys
    from django_conveyor.models import ApiKey

    key, raw = keys.create("billing", ["enqueue"])
    page = staff.get(reverse("admin:conveyor_apikey_changelist")).content.decode()
    assert "billing" in page and key.prefix in page and key.secret_hash not in page
    detail = staff.get(reverse("admin:conveyor_apikey_change", args=[key.pk])).content.decode()
    assert key.secret_hash not in detail and raw not in detail
    staff.post(
        reverse("admin:conveyor_apikey_changelist"),
        {"action": "revoke_api_keys", "_selected_action": [key.pk]},
    )
    assert ApiKey.objects.get().revoked_at is not None
    assert keys.authenticate(raw) is None
