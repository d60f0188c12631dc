"""The admin and unique jobs: the job page's uniqueness, the search by key, refused requeues."""

import datetime as dt

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from django_conveyor import Unique, protocol
from django_conveyor.models import Job
from tests.helpers import run_burst
from tests.test_admin import JOBS, act, job_page
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


class TestTheJobPage:
    def test_it_shows_the_key_its_window_and_what_it_was_made_of(self, staff):
        result = tasks.debounced.using(unique=Unique(by=lambda account_id, **rest: account_id,
                                                     period=3600, on_duplicate="replace")).enqueue(
            42, note="a"
        )  # fmt: skip
        tasks.debounced.using(unique=Unique(by=lambda account_id, **rest: account_id,
                                            period=3600, on_duplicate="replace")).enqueue(
            42, note="b"
        )  # fmt: skip
        job = Job.objects.get(pk=result.id)
        body = staff.get(job_page(job)).content.decode()
        assert f'<code id="conveyor-unique-key">{job.unique_key}</code>' in body
        assert "by this job (available)" in body
        start = job.unique_window.astimezone(dt.UTC)
        assert f"{start:%Y-%m-%d %H:%M:%S} to " in body and "UTC (period 3600 s)" in body
        assert "task, tests.test_admin_unique." in body and "(key: <code>42</code>)" in body
        assert "blocked, available, running" in body
        assert "replaced 1 time" in body
        assert f'href="{JOBS}?q={job.unique_key}"' in body

    def test_a_finished_job_links_to_the_job_holding_its_key_now(self, staff):
        first = tasks.unique_add.enqueue(1, 2)
        run_burst()
        holder = tasks.unique_add.enqueue(1, 2)
        body = staff.get(job_page(Job.objects.get(pk=first.id))).content.decode()
        url = reverse("admin:conveyor_job_change", args=[holder.id])
        assert f'by <a href="{url}">job {holder.id}</a> (available)' in body
        run_burst()
        body = staff.get(job_page(Job.objects.get(pk=first.id))).content.decode()
        assert "by no job: the next call with this key creates one" in body

    def test_a_job_without_a_key_shows_no_uniqueness(self, staff):
        plain = tasks.add.enqueue(1, 2)
        assert "conveyor-uniqueness" not in staff.get(job_page(plain)).content.decode()

    def test_the_callables_value_needs_the_payload_permission(self, client):
        from django.contrib.auth.models import Permission

        user = User.objects.create_user("limited", "l@example.com", "pw", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename="view_job"))
        client.force_login(user)
        result = tasks.debounced.enqueue(42)
        body = client.get(job_page(Job.objects.get(pk=result.id))).content.decode()
        assert "conveyor-uniqueness" in body and "(key: <code>42</code>)" not in body


class TestSearch:
    def test_a_key_finds_every_job_that_held_it(self, staff):
        first = tasks.unique_add.enqueue(1, 2)
        run_burst()
        second = tasks.unique_add.enqueue(1, 2)
        other = tasks.unique_add.enqueue(5, 5)
        key = Job.objects.get(pk=first.id).unique_key
        listed = staff.get(JOBS, {"q": key}).context["cl"].result_list
        assert [job.id for job in listed] == [int(second.id), int(first.id)]
        assert int(other.id) not in [job.id for job in listed]


class TestRequeue:
    def test_a_refused_requeue_names_the_job_holding_the_key(self, staff, cur):
        first = tasks.unique_add.enqueue(1, 2)
        protocol.cancel(cur, ids=[int(first.id)])
        holder = tasks.unique_add.enqueue(1, 2)
        response = act(staff, JOBS, "requeue_jobs", [first.id], confirm=True)
        texts = [str(m) for m in response.context["messages"]]
        assert any(
            f"job {first.id}: held by job {holder.id} (available)" in text for text in texts
        ), texts
        assert "No job was requeued." in texts
        assert Job.objects.get(pk=first.id).state == "cancelled"

    def test_the_job_pages_button_says_the_same(self, staff, cur):
        first = tasks.unique_add.enqueue(1, 2)
        protocol.cancel(cur, ids=[int(first.id)])
        holder = tasks.unique_add.enqueue(1, 2)
        url = reverse("admin:conveyor_job_requeue", args=[first.id])
        response = staff.post(url, {"post": "yes"}, follow=True)
        texts = [str(m) for m in response.context["messages"]]
        assert any(f"held by job {holder.id} (available)" in text for text in texts), texts


@pytest.mark.parametrize(
    ("uniqueness", "states"),
    [("junk", "running"), ({"by": 5, "period": "x", "replaced_at": "nope"}, {"a": 1})],
)
def test_a_bad_uniqueness_in_a_row_still_shows_its_page(staff, uniqueness, states):
    result = tasks.unique_add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(uniqueness=uniqueness, unique_states=states)
    job = Job.objects.get(pk=result.id)
    response = staff.get(job_page(job))
    assert response.status_code == 200
    assert f'<code id="conveyor-unique-key">{job.unique_key}</code>' in response.content.decode()
    assert staff.get(reverse("admin:conveyor_job_changelist")).status_code == 200
