"""The schedules' admin (Django's test client) and `manage.py conveyor_cron`."""

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from django_conveyor.models import Cron, Job
from django_conveyor.periodic import schedules
from tests.factories import CronFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

TASK = "tests.testapp.tasks.nightly_report"
CHANGELIST = "admin:conveyor_cron_changelist"


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


def act(staff, action, *rows):
    return staff.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [r.pk for r in rows]},
        follow=True,
    ).content.decode()


def form(**changes):
    data = {
        "name": "adhoc", "schedule": "0 3 * * *", "timezone": "Europe/Berlin",
        "task_path": TASK, "args": "[]", "kwargs": '{"full": true}', "queue": "",
        "priority": "", "missed": "latest", "enabled": "on",
    }  # fmt: skip
    data.update(changes)
    return data


def test_the_list_shows_ticks_local_and_utc_the_last_job_and_the_owner(staff):
    job = JobFactory(completed=True)
    CronFactory(name="nightly", schedule="0 3 * * *", timezone="Europe/Berlin",
                declared=True, last_job_id=job.id, last_tick_at=job.enqueued_at)  # fmt: skip
    body = staff.get(reverse(CHANGELIST)).content.decode()
    assert "nightly" in body and "0 3 * * *" in body
    assert "03:00:00 CE" in body and " UTC)" in body  # CET or CEST, then the UTC instant
    assert f"job {job.id}: completed" in body
    assert reverse("admin:conveyor_job_change", args=[job.id]) in body
    assert ">settings<" in body


def test_run_now_enqueues_an_extra_job_with_its_own_key(staff):
    cron = CronFactory(name="nightly", task_path=TASK, kwargs={"full": True}, queue="emails")
    body = act(staff, "run_now", cron)
    job = Job.objects.get()
    assert f"Enqueued job {job.id} for schedule &#x27;nightly&#x27;." in body
    assert job.idempotency_key.startswith("cron:nightly:manual:")
    assert (job.task_path, job.kwargs, job.queue) == (TASK, {"full": True}, "emails")
    act(staff, "run_now", cron)
    assert Job.objects.count() == 2
    cron.refresh_from_db()
    assert cron.last_tick_at is None  # ticks are untouched


def test_enable_and_disable_actions(staff):
    cron = CronFactory(declared=True)
    assert "Disabled 1 schedule(s)." in act(staff, "disable", cron)
    assert not Cron.objects.get(pk=cron.pk).enabled
    assert "Enabled 1 schedule(s)." in act(staff, "enable", cron)
    assert Cron.objects.get(pk=cron.pk).enabled


def test_settings_rows_are_read_only_except_enabled(staff):
    cron = CronFactory(name="nightly", schedule="0 3 * * *", declared=True)
    url = reverse("admin:conveyor_cron_change", args=[cron.pk])
    page = staff.get(url).content.decode()
    assert 'name="schedule"' not in page and 'name="enabled"' in page
    response = staff.post(url, {"schedule": "* * * * *", "name": "renamed"})
    assert response.status_code == 302
    row = Cron.objects.get(pk=cron.pk)
    assert (row.name, row.schedule, row.enabled) == ("nightly", "0 3 * * *", False)
    assert staff.get(reverse("admin:conveyor_cron_delete", args=[cron.pk])).status_code == 403


def test_admin_schedules_are_created_and_edited_with_the_checks_validation(staff):
    response = staff.post(reverse("admin:conveyor_cron_add"), form())
    assert response.status_code == 302, response.content.decode()[:2000]
    row = Cron.objects.get(name="adhoc")
    assert (row.declared, row.queue, row.priority, row.kwargs) == (
        False,
        "emails",
        5,
        {"full": True},
    )
    assert row.next_tick_at is not None
    url = reverse("admin:conveyor_cron_change", args=[row.pk])
    assert staff.post(url, form(schedule="30 4 * * *")).status_code == 302
    assert Cron.objects.get(pk=row.pk).schedule == "30 4 * * *"


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"schedule": "61 3 * * *"}, "schedule", "is not a cron expression: Bad minute."),
        ({"timezone": "Mars/Olympus"}, "timezone", "is not a known IANA time zone."),
        ({"task_path": "nowhere.x"}, "task_path", "does not import"),
        ({"task_path": "tests.testapp.tasks.not_a_task"}, "task_path", "is not a task"),
        ({"queue": "reports"}, "queue", "is not a queue of task backend"),
        ({"queue": "other"}, "queue", "lives in database &#x27;shard&#x27;"),
        ({"args": '{"a": 1}'}, "args", "Must be a list"),
        ({"name": "bad name"}, "name", "A schedule name is 1 to 100 letters"),
    ],
)
def test_bad_input_is_a_form_error_and_nothing_is_written(staff, change, field, message):
    response = staff.post(reverse("admin:conveyor_cron_add"), form(**change))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and message.replace("&#x27;", "'") in " ".join(errors[field])
    assert Cron.objects.count() == 0


def test_cli_list_run_enable_disable():
    CronFactory(name="nightly", schedule="0 3 * * *", task_path=TASK, queue="emails")
    out = StringIO()
    call_command("conveyor_cron", "list", stdout=out)
    assert out.getvalue().startswith("nightly\tenabled\tadmin\t0 3 * * * UTC\t" + TASK)
    out = StringIO()
    call_command("conveyor_cron", "run", "nightly", stdout=out)
    job = Job.objects.get()
    assert out.getvalue() == f"Enqueued job {job.id} for schedule 'nightly'.\n"
    call_command("conveyor_cron", "disable", "nightly", stdout=StringIO())
    assert not Cron.objects.get().enabled
    out = StringIO()
    call_command("conveyor_cron", "disable", "nightly", stdout=out)
    assert out.getvalue() == "'nightly' was disabled.\n"
    call_command("conveyor_cron", "enable", "nightly", stdout=StringIO())
    assert Cron.objects.get().enabled
    with pytest.raises(CommandError, match=r"No schedule is named 'nope'\."):
        call_command("conveyor_cron", "run", "nope")
    with pytest.raises(CommandError, match=r"Name the schedule to enable\."):
        call_command("conveyor_cron", "enable")


@pytest.mark.parametrize("enabled", [False, True])
def test_enabling_a_stopped_schedule_restarts_it(enabled):
    cron = CronFactory(enabled=enabled, next_tick_at=None)
    assert schedules.set_enabled(cron.name, True)
    assert Cron.objects.get(pk=cron.pk).next_tick_at is not None


def test_bulk_delete_refuses_settings_rows(staff):
    mine, theirs = CronFactory(), CronFactory(declared=True)
    response = staff.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "_selected_action": [mine.pk, theirs.pk], "post": "yes"},
    )
    assert response.status_code == 403
    assert Cron.objects.count() == 2
    staff.post(
        reverse(CHANGELIST),
        {"action": "delete_selected", "_selected_action": [mine.pk], "post": "yes"},
    )
    assert list(Cron.objects.values_list("pk", flat=True)) == [theirs.pk]
