"""Queue limits on the operator surfaces: the admin, `conveyor_queues limit`, the API, metrics.

Each writes through `limits.set_limits` and refuses a bad limit with the
message `limits` gives, naming the field, with nothing written. The
throttled counts come from one query (`queue_counts.throttled`), read here
after real limited claims (`protocol.claim_limited`).
"""

import datetime as dt
import json

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.urls import reverse
from django.utils import timezone

from django_conveyor import limits, protocol, queue_counts
from django_conveyor.api import keys
from django_conveyor.limits import Limits, Rate
from django_conveyor.models import Job, Queue
from tests.factories import JobFactory
from tests.test_metrics import metrics_key, scrape, value

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

QUEUES = reverse("admin:conveyor_queue_changelist")
LIMITS_API = "/conveyor/api/queues/{}/limits"
RATE_MESSAGE = (
    'rate must be a number of starts per second, minute or hour, such as "100/m" '
    "(N/s, N/m or N/h with N from 1 to 2147483647), not {!r}."
)
COUNT_MESSAGE = (
    "{} must be a whole number of jobs from 1 to 2147483647, or none for no limit, not {!r}."
)


def set_limits(name="emails", **values) -> None:
    rate = values.pop("rate", None)
    limits.set_limits(name, Limits(rate=limits.parse_rate(rate), **values), actor="test")


def row(name="emails") -> Queue:
    return Queue.objects.get(name=name)


def claim(queue="emails", owner="w1", n=10) -> list:
    """One limited claim, as a worker's cycle runs it."""
    with transaction.atomic(), connection.cursor() as cur:
        if queue not in protocol.lock_limited(cur, queues=[queue]):
            return []
        return protocol.claim_limited(
            cur, owner=owner, queue=queue, limit=n, lease_seconds=30, isolated=False
        )


def throttled(name="emails") -> dict[str, int]:
    return queue_counts.snapshot([name])[name].throttled


# -- the admin ---------------------------------------------------------------------------------


def change_page(name="emails") -> str:
    return reverse("admin:conveyor_queue_change", args=[name])


@pytest.fixture
def login_with(client):
    def login(*codenames, superuser=False):
        if superuser:
            user = User.objects.create_superuser("ops", "ops@example.com", "pw")
        else:
            user = User.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
            user.user_permissions.set(
                Permission.objects.filter(
                    content_type__app_label="conveyor", codename__in=codenames
                )
            )
        client.force_login(user)
        client.get(QUEUES)  # creates the known queues' rows
        return client

    return login


def post_limits(client, name="emails", **values):
    data = {"concurrency": "", "rate": "", "key_concurrency": "", **values, "_save": "1"}
    if data.get("fair") is False:
        del data["fair"]
    return client.post(change_page(name), data)


class TestAdmin:
    def test_the_list_shows_each_queues_limits(self, login_with):
        client = login_with("view_queue")
        set_limits(concurrency=5, rate="100/m", fair=True)
        response = client.get(QUEUES)
        body = response.content.decode()
        assert "concurrency 5, rate 100/m, fair" in body
        assert "column-limits" in body

    def test_an_operator_sets_the_limits_logged_with_old_and_new(self, login_with):
        client = login_with("view_queue", "operate")
        set_limits(concurrency=5)
        page = client.get(change_page()).content.decode()
        assert 'name="concurrency"' in page and 'value="5"' in page
        response = post_limits(client, concurrency="3", rate="10/s", key_concurrency="1",
                               fair="on")  # fmt: skip
        assert response.status_code == 302
        queue = row()
        assert limits.of(queue) == Limits(3, 1, Rate(10, 1), True)
        assert queue.limits_changed_by == "admin:ops"
        assert queue.limits_changed_at is not None
        entry = LogEntry.objects.get()
        assert entry.action_flag == CHANGE and entry.object_id == "emails"
        assert entry.change_message == (
            "Changed limits from concurrency 5 to concurrency 3, rate 10/s, key_concurrency 1, "
            "fair."
        )
        # Blank fields remove their limits; the pause is not the form's to change.
        Queue.objects.filter(name="emails").update(paused=True)
        assert post_limits(client).status_code == 302
        assert limits.of(row()) == Limits() and row().paused

    @pytest.mark.parametrize(
        ("field", "text", "message"),
        [
            ("rate", "100 per minute", RATE_MESSAGE.format("100 per minute")),
            ("rate", "0/s", RATE_MESSAGE.format("0/s")),
            ("concurrency", "0", COUNT_MESSAGE.format("concurrency", 0)),
            ("concurrency", "many", COUNT_MESSAGE.format("concurrency", "many")),
            ("key_concurrency", "99999999999", COUNT_MESSAGE.format("key_concurrency",
                                                                     99999999999)),
        ],
    )  # fmt: skip
    def test_a_bad_limit_is_a_form_error_naming_its_field_and_nothing_is_written(
        self, login_with, field, text, message
    ):
        client = login_with("view_queue", "operate")
        set_limits(concurrency=5)
        changed_at = row().limits_changed_at
        response = post_limits(client, **{"concurrency": "5", field: text})
        assert response.status_code == 200
        assert response.context["adminform"].form.errors == {field: [message]}
        assert limits.of(row()) == Limits(concurrency=5)
        assert row().limits_changed_at == changed_at
        assert not LogEntry.objects.exists()

    def test_without_operate_the_limits_are_read_only(self, login_with):
        client = login_with("view_queue", "change_job")
        set_limits(rate="5/h")
        page = client.get(change_page()).content.decode()
        assert "rate 5/h" in page
        assert 'name="rate"' not in page and 'name="_save"' not in page
        assert post_limits(client, rate="1/s").status_code == 403
        assert limits.of(row()) == Limits(rate=Rate(5, 3600))

    def test_a_new_queue_can_be_added_with_limits(self, login_with):
        client = login_with(superuser=True)
        response = client.post(
            reverse("admin:conveyor_queue_add"),
            {"name": "reports", "concurrency": "2", "rate": "", "key_concurrency": ""},
        )
        assert response.status_code == 302
        assert limits.of(row("reports")) == Limits(concurrency=2)
        entry = LogEntry.objects.get()
        assert entry.action_flag == ADDITION
        assert entry.change_message == "Changed limits from none to concurrency 2."


def test_the_dashboard_marks_limited_queues_with_their_throttled_jobs(login_with):
    client = login_with(superuser=True)
    JobFactory.create_batch(3, queue="emails")
    set_limits(concurrency=1)
    set_limits(name="slow", fair=True)
    claim()
    response = client.get(reverse("admin:conveyor_dashboard_changelist"))
    by_name = {q.name: q for q, _ in response.context["rows"]}
    assert (by_name["emails"].limited, by_name["emails"].throttled) == (True, 2)
    assert (by_name["slow"].limited, by_name["slow"].throttled) == (True, 0)
    assert not by_name["default"].limited
    body = response.content.decode()
    assert "limited, 2 throttled" in body
    assert 'title="concurrency 1; 2 ready job(s) wait for a limit"' in body
    assert body.count('class="conveyor-limited"') == 2


# -- the command -------------------------------------------------------------------------------


class TestCommand:
    def test_list_shows_the_limits(self, capsys):
        JobFactory(queue="emails")
        set_limits(concurrency=2, rate="30/m")
        call_command("conveyor_queues", "list")
        out = capsys.readouterr().out
        assert "emails\tactive\twaiting=1\trunning=0\tlimits=concurrency 2, rate 30/m" in out
        assert "default\tactive\twaiting=0\trunning=0\tlimits=none" in out

    def test_limit_changes_only_the_options_given_and_prints_before_and_after(self, capsys):
        JobFactory(queue="emails")
        set_limits(concurrency=2, rate="30/m")
        call_command("conveyor_queues", "limit", "emails", "--key-concurrency", "1", "--fair")
        assert capsys.readouterr().out == (
            "emails: limits concurrency 2, rate 30/m -> "
            "concurrency 2, rate 30/m, key_concurrency 1, fair\n"
        )
        assert row().limits_changed_by == "command"
        call_command("conveyor_queues", "limit", "emails", "--rate", "none", "--no-fair")
        assert limits.of(row()) == Limits(concurrency=2, key_concurrency=1)
        call_command("conveyor_queues", "limit", "emails", "--clear", "--concurrency", "4")
        assert limits.of(row()) == Limits(concurrency=4)
        call_command("conveyor_queues", "limit", "emails", "--clear")
        assert limits.of(row()) == Limits()
        assert capsys.readouterr().out.splitlines()[-1] == "emails: limits concurrency 4 -> none"

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (["--concurrency", "0"], COUNT_MESSAGE.format("--concurrency", 0)),
            (["--key-concurrency", "lots"], COUNT_MESSAGE.format("--key-concurrency", "lots")),
            (["--rate", "5/d"], RATE_MESSAGE.replace("rate must", "--rate must").format("5/d")),
        ],
    )
    def test_bad_input_names_the_option_and_writes_nothing(self, options, message):
        JobFactory(queue="emails")
        set_limits(concurrency=2)
        with pytest.raises(CommandError) as raised:
            call_command("conveyor_queues", "limit", "emails", "--fair", *options)
        assert str(raised.value) == message
        assert limits.of(row()) == Limits(concurrency=2)

    def test_limit_needs_one_known_queue_and_its_options_belong_to_it(self):
        with pytest.raises(CommandError, match="Unknown queue"):
            call_command("conveyor_queues", "limit", "nope", "--concurrency", "1")
        with pytest.raises(CommandError, match="Name one queue to limit, not 2"):
            call_command("conveyor_queues", "limit", "emails", "default", "--concurrency", "1")
        with pytest.raises(CommandError, match="Name the queue to limit"):
            call_command("conveyor_queues", "limit")
        with pytest.raises(CommandError, match="--rate is an option of 'limit', not of 'pause'"):
            call_command("conveyor_queues", "pause", "emails", "--rate", "1/s")
        assert not Queue.objects.filter(paused=True).exists()


# -- the API -----------------------------------------------------------------------------------


def bearer(*scopes: str, name: str = "svc") -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {keys.create(name, list(scopes))[1]}"}


def put_limits(client, body, name="emails", **headers):
    return client.put(LIMITS_API.format(name), body, content_type="application/json", **headers)


class TestApi:
    def test_get_queues_shows_the_limits_and_the_throttled_jobs(self, client):
        JobFactory.create_batch(3, queue="emails")
        set_limits(concurrency=1, rate="100/m")
        assert len(claim()) == 1
        queues = {q["name"]: q for q in client.get("/conveyor/api/queues", **bearer("read")).json()}
        assert queues["emails"]["limits"] == {
            "concurrency": 1, "rate": "100/m", "key_concurrency": None, "fair": False,
        }  # fmt: skip
        assert queues["emails"]["throttled"] == {"concurrency": 2, "rate": 0, "key_concurrency": 0}
        assert queues["default"]["limits"]["concurrency"] is None
        assert queues["default"]["throttled"] == {}

    def test_an_operator_key_sets_them(self, client):
        headers = bearer("operate", name="deploy")
        body = {"concurrency": 4, "rate": "2/s", "key_concurrency": None, "fair": True}
        response = put_limits(client, body, **headers)
        assert response.status_code == 200, response.content
        assert response.json() == body
        assert limits.of(row()) == Limits(4, None, Rate(2, 1), True)
        assert row().limits_changed_by == "api:deploy"
        # A field left out is no such limit.
        assert put_limits(client, {"rate": "9/h"}, **headers).json() == {
            "concurrency": None, "rate": "9/h", "key_concurrency": None, "fair": False,
        }  # fmt: skip

    def test_only_the_operate_scope_may(self, client):
        response = put_limits(client, {"concurrency": 1}, **bearer("read", "enqueue"))
        assert response.status_code == 403
        assert response.json()["detail"] == "The API key 'svc' does not have the 'operate' scope."
        assert put_limits(client, {"concurrency": 1}).status_code == 401
        assert limits.current("emails") == Limits()

    @pytest.mark.parametrize(
        ("body", "field", "message"),
        [
            ({"rate": "fast"}, "rate", RATE_MESSAGE.format("fast")),
            ({"concurrency": 0}, "concurrency", COUNT_MESSAGE.format("concurrency", 0)),
            ({"key_concurrency": -2}, "key_concurrency",
             COUNT_MESSAGE.format("key_concurrency", -2)),
        ],
    )  # fmt: skip
    def test_a_bad_limit_is_400_naming_the_field_and_nothing_is_written(
        self, client, body, field, message
    ):
        set_limits(concurrency=2)
        response = put_limits(client, {"concurrency": 2, **body}, **bearer("operate"))
        assert response.status_code == 400
        assert response.json()["errors"] == [
            {"field": field, "location": "body", "message": message}
        ]
        assert limits.of(row()) == Limits(concurrency=2)

    def test_a_wrong_type_an_unknown_field_or_queue(self, client):
        headers = bearer("operate")
        wrong = put_limits(client, {"concurrency": "3"}, **headers)
        assert wrong.status_code == 400
        assert [e["field"] for e in wrong.json()["errors"]] == ["concurrency"]
        unknown = put_limits(client, {"burst": 3}, **headers)
        assert unknown.status_code == 400
        assert [e["field"] for e in unknown.json()["errors"]] == ["burst"]
        missing = put_limits(client, {"concurrency": 1}, name="nope", **headers)
        assert missing.status_code == 404
        assert not Queue.objects.filter(name="nope").exists()


# -- throttled jobs and the metric -------------------------------------------------------------


class TestThrottled:
    def test_concurrency(self, client):
        JobFactory.create_batch(5, queue="emails")
        JobFactory(queue="emails", run_after=timezone.now() + dt.timedelta(hours=1))  # not due
        set_limits(concurrency=2)
        assert throttled() == {"concurrency": 0, "rate": 0, "key_concurrency": 0}
        assert len(claim()) == 2
        assert throttled() == {"concurrency": 3, "rate": 0, "key_concurrency": 0}
        samples = scrape(client, **metrics_key())
        assert value(samples, "conveyor_jobs_throttled", queue="emails", reason="concurrency") == 3
        assert value(samples, "conveyor_jobs_throttled", queue="emails", reason="rate") == 0
        assert ("conveyor_jobs_throttled", (("queue", "default"), ("reason", "rate"))) not in (
            samples
        )

    def test_rate(self):
        JobFactory.create_batch(4, queue="emails")
        set_limits(rate="3/h")
        assert len(claim()) == 3
        assert throttled() == {"concurrency": 0, "rate": 1, "key_concurrency": 0}
        # The window's starts are older than the period: nothing waits for the rate.
        with connection.cursor() as cur:
            cur.execute(
                "UPDATE conveyor_queue SET rate_times = array_fill(0::float8, "
                "ARRAY[cardinality(rate_times)]) WHERE name = 'emails'"
            )
        assert throttled() == {"concurrency": 0, "rate": 0, "key_concurrency": 0}

    def test_key_concurrency(self):
        for key in ("a", "a", "a", "b", "b"):
            JobFactory(queue="emails", concurrency_key=key)
        set_limits(key_concurrency=1)
        assert len(claim(n=2)) == 2  # one of a, one of b
        JobFactory(queue="emails")  # no key: never waits for one
        assert throttled() == {"concurrency": 0, "rate": 0, "key_concurrency": 3}

    def test_a_paused_or_unlimited_queue_has_none(self):
        JobFactory.create_batch(2, queue="emails")
        set_limits(concurrency=1)
        claim()
        Queue.objects.filter(name="emails").update(paused=True)
        assert throttled() == {}
        set_limits(name="default")
        assert throttled("default") == {}


def test_the_api_enqueues_with_a_concurrency_key_and_refuses_a_bad_one(client):
    headers = bearer("enqueue")
    body = {"task": "tests.testapp.tasks.add", "args": [1, 2], "concurrency_key": "tenant:9"}
    response = client.post(
        "/conveyor/api/jobs", json.dumps(body), content_type="application/json", **headers
    )
    assert response.status_code == 201, response.content
    assert Job.objects.get(pk=int(response.json()["id"])).concurrency_key == "tenant:9"
    bad = {**body, "concurrency_key": "x" * 256}
    response = client.post(
        "/conveyor/api/jobs", json.dumps(bad), content_type="application/json", **headers
    )
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["field"] == "concurrency_key"
    assert "at most 255 characters" in error["message"]
    assert Job.objects.count() == 1
