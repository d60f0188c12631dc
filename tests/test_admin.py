"""The admin, driven through Django's test client as a logged-in staff user."""

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_conveyor.models import Job, Queue
from tests.factories import JobFactory, LedgerEntryFactory
from tests.helpers import run_burst

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


@pytest.fixture
def staff(client):
    user = User.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    return client


def test_requeue_action_brings_a_dead_job_back_and_it_completes(staff):
    dead = JobFactory(dead=True)
    response = staff.post(
        reverse("admin:conveyor_deadletter_changelist"),
        {"action": "requeue_jobs", "_selected_action": [dead.id]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Requeued 1 job(s)." in response.content.decode()
    assert Job.objects.get(pk=dead.id).state == "available"
    run_burst()
    job = Job.objects.get(pk=dead.id)
    assert (job.state, job.return_value) == ("completed", 3)
    assert len(job.errors) == 3  # history kept


def test_requeue_skips_jobs_that_are_not_failed(staff):
    done = JobFactory(completed=True)
    response = staff.post(
        reverse("admin:conveyor_job_changelist"),
        {"action": "requeue_jobs", "_selected_action": [done.id]},
        follow=True,
    )
    assert "Skipped 1 job(s)" in response.content.decode()
    assert Job.objects.get(pk=done.id).state == "completed"


def test_cancel_action(staff):
    waiting = JobFactory()
    running = JobFactory(running=True)
    response = staff.post(
        reverse("admin:conveyor_job_changelist"),
        {"action": "cancel_jobs", "_selected_action": [waiting.id, running.id]},
        follow=True,
    )
    body = response.content.decode()
    assert "Cancelled 1 job(s)." in body
    assert "Skipped 1 job(s) that had already started" in body
    assert Job.objects.get(pk=waiting.id).state == "cancelled"
    assert Job.objects.get(pk=running.id).state == "running"


def test_dead_letter_view_lists_only_failed_and_dead(staff):
    dead = JobFactory(dead=True)
    failed = JobFactory(failed=True)
    ok = JobFactory(completed=True)
    response = staff.get(reverse("admin:conveyor_deadletter_changelist"))
    assert response.status_code == 200
    ids = {row.pk for row in response.context["cl"].result_list}
    assert ids == {dead.id, failed.id}
    assert ok.id not in ids


def test_job_page_shows_each_attempts_traceback_and_ledger(staff):
    dead = JobFactory(dead=True)
    entry = LedgerEntryFactory(job=dead, effect_key="charge-1")
    response = staff.get(reverse("admin:conveyor_job_change", args=[dead.id]))
    body = response.content.decode()
    assert response.status_code == 200
    for n in (1, 2, 3):
        assert f"Traceback: boom {n}" in body
        assert f"attempt {n}" in body
    assert entry.effect_key in body
    assert 'name="_save"' not in body  # read-only


def test_filters_by_state_queue_and_task(staff):
    JobFactory(queue="emails", task_path="tests.testapp.tasks.send_email")
    JobFactory(dead=True)
    url = reverse("admin:conveyor_job_changelist")
    assert staff.get(url, {"state": "dead"}).context["cl"].result_count == 1
    assert staff.get(url, {"queue": "emails"}).context["cl"].result_count == 1
    assert (
        staff.get(url, {"task": "tests.testapp.tasks.send_email"}).context["cl"].result_count == 1
    )


def test_pause_and_resume_queues(staff):
    url = reverse("admin:conveyor_queue_changelist")
    response = staff.get(url)
    assert response.status_code == 200
    assert Queue.objects.filter(name="emails").exists()  # known queues are listed
    staff.post(url, {"action": "pause_queues", "_selected_action": ["emails"]}, follow=True)
    assert Queue.objects.get(name="emails").paused is True
    staff.post(url, {"action": "resume_queues", "_selected_action": ["emails"]}, follow=True)
    assert Queue.objects.get(name="emails").paused is False


def test_jobs_cannot_be_added_or_deleted_by_form(staff):
    job = JobFactory()
    assert staff.get(reverse("admin:conveyor_job_add")).status_code == 403
    assert (
        staff.post(reverse("admin:conveyor_job_delete", args=[job.id]), {"post": "yes"}).status_code
        == 403
    )
    assert Job.objects.filter(pk=job.id).exists()


def test_anonymous_users_are_sent_to_login(client):
    response = client.get(reverse("admin:conveyor_job_changelist"))
    assert response.status_code == 302
    assert "/login/" in response["Location"]


def test_api_keys_are_listed_without_their_hash_and_can_be_revoked(staff):
    from django_conveyor import apikeys
    from django_conveyor.models import ApiKey

    key, raw = apikeys.create("billing", ["enqueue"])
    page = staff.get(reverse("admin:conveyor_apikey_changelist")).content.decode()
    assert "billing" in page and key.prefix in page and key.secret_hash not in page
    detail = staff.get(reverse("admin:conveyor_apikey_change", args=[key.pk])).content.decode()
    assert key.secret_hash not in detail and raw not in detail
    staff.post(
        reverse("admin:conveyor_apikey_changelist"),
        {"action": "revoke_api_keys", "_selected_action": [key.pk]},
    )
    assert ApiKey.objects.get().revoked_at is not None
    assert apikeys.authenticate(raw) is None
