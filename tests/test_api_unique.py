"""The HTTP API's unique jobs: the `unique` body, 201 or 200, the job's key, requeue's 409."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from django_conveyor import protocol
from django_conveyor.api import keys
from django_conveyor.models import Job
from tests.helpers import run_burst
from tests.test_api import ADD, JOBS, enqueue, field_errors

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

UNIQUE = "tests.testapp.tasks.unique_add"


@pytest.fixture
def api(client):
    headers = {
        "HTTP_AUTHORIZATION": "Bearer " + keys.create("svc", ["enqueue", "read", "operate"])[1]
    }

    class Api:
        def post(self, path, body=None, **extra):
            return client.post(path, json.dumps(body or {}), content_type="application/json",
                               **headers, **extra)  # fmt: skip

        def get(self, path, **params):
            return client.get(path, params, **headers)

    return Api()


@pytest.fixture(autouse=True)
def _unique_task_allowed(settings):
    settings.CONVEYOR = {**settings.CONVEYOR, "API_TASKS": [ADD, UNIQUE]}


class TestEnqueue:
    def test_201_then_200_with_the_job_that_holds_the_key(self, api):
        body = {"task": ADD, "args": [1, 2], "unique": {"period": 3600, "by": ["args"]}}
        first = enqueue(api, body)
        again = enqueue(api, body)
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json()["id"] == first.json()["id"]
        assert again["Location"] == first["Location"]
        unique = first.json()["unique"]
        assert unique["key"] == Job.objects.get().unique_key and len(unique["key"]) == 64
        assert unique["period"] == 3600 and unique["by"] == ["task", "args"]
        assert unique["states"] == ["blocked", "available", "running"]
        assert unique["window_start"] is not None and unique["window_end"] is not None
        assert Job.objects.count() == 1

    def test_the_tasks_own_unique_applies_and_false_turns_it_off(self, api):
        first = enqueue(api, {"task": UNIQUE, "args": [1, 2]})
        folded = enqueue(api, {"task": UNIQUE, "args": [1, 2]})
        forced = enqueue(api, {"task": UNIQUE, "args": [1, 2], "unique": False})
        assert [r.status_code for r in (first, folded, forced)] == [201, 200, 201]
        assert forced.json()["unique"] is None and first.json()["unique"] is not None
        assert Job.objects.count() == 2

    def test_replace_gives_the_waiting_job_the_new_arguments(self, api):
        body = {"task": ADD, "args": [1, 2], "unique": {"by": ["task"], "on_duplicate": "replace"}}
        first = enqueue(api, body)
        second = enqueue(api, {**body, "args": [3, 4]})
        assert second.status_code == 200
        assert second.json()["args"] == [3, 4] and second.json()["unique"]["replaced"] == 1
        run_burst()
        assert api.get(first["Location"]).json()["return_value"] == 7

    @pytest.mark.parametrize(
        ("unique", "message"),
        [
            ({"by": ["kwarg"]}, "Input should be"),
            ({"by": []}, "at least 1 item"),
            ({"period": 0}, "greater than or equal to 1"),
            ({"period": 1.5}, "valid integer"),
            ({"period": "60"}, "valid integer"),
            ({"states": ["available"]}, "must contain blocked, available and running"),
            ({"states": ["done"]}, "Input should be"),
            ({"on_duplicate": "update"}, "Input should be 'skip' or 'replace'"),
            ({"unknown": 1}, "Extra inputs are not permitted"),
            ("yes", "valid dictionary"),
        ],
    )
    def test_a_bad_unique_is_400_naming_it(self, api, unique, message):
        errors = field_errors(enqueue(api, {"task": ADD, "args": [1, 2], "unique": unique}))
        assert any(
            "unique" in (field or "") and message in text for field, text in errors.items()
        ), errors
        assert Job.objects.count() == 0

    def test_the_schema_describes_unique(self, client):
        schema = client.get("/conveyor/api/openapi.json").json()["components"]["schemas"]
        assert {"by", "period", "states", "on_duplicate"} <= set(schema["UniqueIn"]["properties"])
        assert "unique" in schema["EnqueueIn"]["properties"]
        assert "unique" in schema["JobOut"]["properties"]
        assert {"key", "window_start", "window_end", "replaced"} <= set(
            schema["UniqueOut"]["properties"]
        )


class TestFinding:
    def test_list_the_jobs_of_a_key(self, api):
        first = enqueue(api, {"task": UNIQUE, "args": [1, 2]}).json()
        run_burst()
        second = enqueue(api, {"task": UNIQUE, "args": [1, 2]}).json()
        enqueue(api, {"task": UNIQUE, "args": [5, 5]})
        page = api.get(JOBS, unique_key=first["unique"]["key"]).json()
        assert [job["id"] for job in page["items"]] == [second["id"], first["id"]]
        only_done = api.get(JOBS, unique_key=first["unique"]["key"], state="completed").json()
        assert [job["id"] for job in only_done["items"]] == [first["id"]]
        searched = api.get(JOBS, unique_key=first["unique"]["key"], q=first["id"]).json()
        assert [job["id"] for job in searched["items"]] == [first["id"]]  # Both filters apply.
        assert field_errors(api.get(JOBS, unique_key="nothex"))

    def test_requeue_is_409_naming_the_job_that_holds_the_key(self, api, cur):
        first = enqueue(api, {"task": UNIQUE, "args": [1, 2]}).json()
        protocol.cancel(cur, ids=[int(first["id"])])
        holder = enqueue(api, {"task": UNIQUE, "args": [1, 2]}).json()
        refused = api.post(f"{JOBS}/{first['id']}/requeue")
        assert refused.status_code == 409
        assert refused.json()["job_id"] == first["id"]
        assert f"held by job {holder['id']} (available)" in refused.json()["detail"]
        assert Job.objects.get(pk=first["id"]).state == "cancelled"


def test_over_a_real_socket(live_server, settings):
    raw = keys.create("live", ["enqueue", "read"])[1]

    def post(body):
        request = urllib.request.Request(
            live_server.url + JOBS, data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    body = {"task": ADD, "args": [20, 22], "unique": {"by": ["args"]}}
    status, job = post(body)
    assert status == 201
    status, again = post(body)
    assert (status, again["id"], again["unique"]["key"]) == (200, job["id"], job["unique"]["key"])
    status, problem = post({**body, "unique": {"states": ["completed"]}})
    assert status == 400 and "must contain blocked" in json.dumps(problem)


BAD_ROWS = [
    ("junk", "running"),
    ({"by": 5, "period": "x", "on_duplicate": 1, "replaced": -3, "replaced_at": "nope"}, {"a": 1}),
    ({"period": 10**12, "replaced": True, "replaced_at": 7}, [1, None]),
]


@pytest.mark.parametrize(("uniqueness", "states"), BAD_ROWS)
def test_a_bad_uniqueness_in_a_row_fails_neither_the_job_nor_the_list(api, uniqueness, states):
    good = enqueue(api, {"task": UNIQUE, "args": [1, 2]}).json()
    bad = enqueue(api, {"task": UNIQUE, "args": [3, 4]}).json()
    Job.objects.filter(pk=bad["id"]).update(uniqueness=uniqueness, unique_states=states)
    shown = api.get(f"{JOBS}/{bad['id']}")
    assert shown.status_code == 200, shown.content
    unique = shown.json()["unique"]
    assert unique["key"] == bad["unique"]["key"]
    assert (unique["period"], unique["on_duplicate"], unique["replaced"]) == (None, "skip", 0)
    assert unique["replaced_at"] is None
    assert all(isinstance(state, str) for state in unique["states"])
    listed = api.get(JOBS)
    assert listed.status_code == 200
    assert {job["id"] for job in listed.json()["items"]} == {good["id"], bad["id"]}
