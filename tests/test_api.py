"""The HTTP API through real requests: the status matrix, the allow-list, pages, auth."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from django_conveyor.api import keys
from django_conveyor.api.errors import BodyTooLarge, LimitedJSONParser
from django_conveyor.models import ApiKey, Job, Queue
from tests.factories import JobFactory
from tests.helpers import run_burst

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

JOBS = "/conveyor/api/jobs"
ADD = "tests.testapp.tasks.add"


def key_for(*scopes: str, name: str = "svc") -> str:
    return keys.create(name, scopes)[1]


def auth(raw: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {raw}"}


@pytest.fixture
def api(client: Client):
    """A client whose requests carry a key with every job scope."""
    headers = auth(key_for("enqueue", "read", "operate"))

    class Api:
        def post(self, path, body=None, *, raw=None, **extra):
            data = raw if raw is not None else json.dumps(body or {})
            return client.post(path, data, content_type="application/json", **headers, **extra)

        def get(self, path, **params):
            return client.get(path, params, **headers)

    return Api()


def enqueue(api, body, key=None):
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return api.post(JOBS, body, **extra)


def field_errors(response) -> dict[str | None, str]:
    assert response.status_code == 400, response.content
    return {e["field"]: e["message"] for e in response.json()["errors"]}


class TestEnqueue:
    def test_201_with_the_job_and_its_location(self, api):
        response = enqueue(api, {"task": ADD, "args": [2, 3], "queue": "emails", "priority": 7})
        assert response.status_code == 201
        body = response.json()
        assert response["Location"] == f"{JOBS}/{body['id']}"
        job = Job.objects.get(pk=int(body["id"]))
        assert (job.task_path, job.args, job.queue, job.priority, job.state) == (
            ADD, [2, 3], "emails", 7, "available"
        )  # fmt: skip
        assert body["state"] == "available" and body["attempt"] == 0
        assert body["run_after"] == body["enqueued_at"]
        run_burst()
        assert api.get(response["Location"]).json()["return_value"] == 5

    def test_same_key_and_body_replays_200_with_the_same_job(self, api):
        first = enqueue(api, {"task": ADD, "args": [1, 2]}, key="order-1")
        again = enqueue(api, {"task": ADD, "args": [1, 2]}, key="order-1")
        assert (first.status_code, again.status_code) == (201, 200)
        assert again.json()["id"] == first.json()["id"]
        assert again["Location"] == first["Location"]
        assert Job.objects.count() == 1

    def test_same_key_with_another_body_is_409_naming_the_job(self, api):
        first = enqueue(api, {"task": ADD, "args": [1, 2]}, key="order-1")
        reused = enqueue(api, {"task": ADD, "args": [1, 3]}, key="order-1")
        assert reused.status_code == 409
        assert reused.json()["job_id"] == first.json()["id"]
        assert "differs in its arguments" in reused.json()["detail"]
        assert Job.objects.count() == 1

    def test_a_deferred_job_keeps_its_run_after(self, api):
        later = datetime.now(UTC) + timedelta(hours=1)
        response = enqueue(api, {"task": ADD, "args": [1, 1], "run_after": later.isoformat()})
        assert response.status_code == 201
        assert Job.objects.get().run_after == later

    def test_a_sharded_queue_gets_an_alias_id(self, api):
        response = enqueue(api, {"task": ADD, "args": [1, 1], "queue": "other"})
        assert response.status_code == 201
        assert response.json()["id"].startswith("shard:")
        assert Job.objects.using("shard").count() == 1
        assert api.get(response["Location"]).json()["queue"] == "other"

    def test_a_task_that_takes_context_gets_its_arguments_checked_without_it(self, api):
        assert (
            enqueue(api, {"task": "tests.testapp.tasks.apply_once", "args": ["x"]}).status_code
            == 201
        )
        refused = enqueue(api, {"task": "tests.testapp.tasks.apply_once", "args": []})
        assert "missing a required argument: 'label'" in field_errors(refused)["args"]
        Job.objects.all().delete()

    def test_a_pattern_on_the_allow_list_admits_the_tasks_it_matches(self, api):
        response = enqueue(api, {"task": "tests.testapp.tasks.fails_then_succeeds", "args": [0]})
        assert response.status_code == 201


class TestEnqueueRefusals:
    """Every 400 names the field, and bad input never writes a row."""

    @pytest.fixture(autouse=True)
    def _no_rows_written(self, db):
        yield
        assert Job.objects.count() == 0
        assert Job.objects.using("shard").count() == 0

    def test_a_task_that_exists_but_is_not_on_the_allow_list(self, api):
        errors = field_errors(enqueue(api, {"task": "tests.testapp.tasks.always_fails"}))
        assert errors == {
            "task": "Task 'tests.testapp.tasks.always_fails' is not on the allow-list "
            "CONVEYOR['API_TASKS'], so the API does not enqueue it."
        }

    def test_an_import_path_that_is_not_a_task_is_never_imported(self, api):
        errors = field_errors(enqueue(api, {"task": "os.system", "args": ["true"]}))
        assert "not on the allow-list" in errors["task"]

    @override_settings(CONVEYOR={"API_TASKS": ["tests.testapp.tasks.*"]})
    def test_an_allowed_name_that_is_no_task(self, api):
        errors = field_errors(enqueue(api, {"task": "tests.testapp.tasks.nope"}))
        assert errors == {
            "task": "Task 'tests.testapp.tasks.nope' is allowed by CONVEYOR['API_TASKS'], "
            "but no such task exists."
        }

    def test_bad_json(self, api):
        response = api.post(JOBS, raw='{"task": ')
        assert response.status_code == 400
        assert response.json()["detail"].startswith("The request body is not valid JSON")

    def test_nan_is_not_json(self, api):
        response = api.post(JOBS, raw=f'{{"task": "{ADD}", "args": [NaN, 1]}}')
        assert "not valid JSON" in response.json()["detail"]

    @pytest.mark.parametrize(
        ("body", "field", "message"),
        [
            ({"task": ADD, "args": [1, 2], "priority": 101}, "priority",
             "Input should be less than or equal to 100."),
            ({"task": ADD, "args": [1, 2], "priority": "5"}, "priority",
             "Input should be a valid integer."),
            ({"task": ADD, "args": [1, 2], "run_after": "tomorrow"}, "run_after",
             "Input should be a valid datetime"),
            ({"task": ADD, "args": [1, 2], "run_after": "2030-01-01T00:00:00"}, "run_after",
             "Input should have timezone info."),
            ({"task": ADD, "args": {"a": 1}}, "args", "Input should be a valid list."),
            ({"task": ADD, "args": [1, 2], "prority": 5}, "prority",
             "Extra inputs are not permitted."),
            ({"args": [1, 2]}, "task", "Field required."),
        ],
    )  # fmt: skip
    def test_field_errors(self, api, body, field, message):
        errors = field_errors(enqueue(api, body))
        assert list(errors) == [field]
        assert errors[field].startswith(message)  # pydantic's wording may grow

    def test_arguments_that_do_not_fit_the_task(self, api):
        errors = field_errors(enqueue(api, {"task": ADD, "args": [1]}))
        assert errors == {
            "args": "The arguments do not fit tests.testapp.tasks.add(): missing a required "
            "argument: 'b'."
        }

    def test_a_queue_the_backend_does_not_have(self, api):
        errors = field_errors(enqueue(api, {"task": ADD, "args": [1, 2], "queue": "nope"}))
        assert errors == {
            "queue": "Queue 'nope' is not one of the backend's QUEUES "
            "(default, emails, other, slow)."
        }

    def test_a_body_over_the_limit(self, api):
        with override_settings(CONVEYOR={"API_TASKS": [ADD], "API_MAX_BODY_BYTES": 100}):
            response = enqueue(api, {"task": ADD, "args": ["x" * 100, 1]})
        assert field_errors(response) == {
            None: "The request body is larger than CONVEYOR['API_MAX_BODY_BYTES'] (100 bytes)."
        }

    def test_a_body_without_a_length_is_measured_when_read(self, rf):
        request = rf.post(JOBS, "{}", content_type="application/json")
        request._body = b'{"args": ["' + b"x" * 200 + b'"]}'  # as ASGI or chunked bodies arrive
        with override_settings(CONVEYOR={"API_MAX_BODY_BYTES": 100}), pytest.raises(BodyTooLarge):
            LimitedJSONParser().parse_body(request)

    def test_an_idempotency_key_that_is_too_long(self, api):
        errors = field_errors(enqueue(api, {"task": ADD, "args": [1, 2]}, key="k" * 256))
        assert errors == {
            "Idempotency-Key": "The Idempotency-Key header must be 1 to 255 characters."
        }


def make_user(client: Client, *perms: str, staff: bool = True) -> User:
    user = User.objects.create_user("ops", "ops@example.com", "pw", is_staff=staff)
    for perm in perms:
        app, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app,
                                                         codename=codename))  # fmt: skip
    client.force_login(user)
    return user


class TestAuthentication:
    def test_401_without_credentials(self, client):
        for method, path in [("post", JOBS), ("get", JOBS), ("get", "/conveyor/api/queues")]:
            response = getattr(client, method)(path)
            assert response.status_code == 401
            assert response["WWW-Authenticate"].startswith("Bearer")
        assert Job.objects.count() == 0

    def test_401_with_an_unknown_revoked_or_malformed_key(self, client):
        raw = key_for("read")
        keys.revoke("svc")
        for header in [f"Bearer {raw}", "Bearer cvk_aaaaaaaa_" + "x" * 43, "Bearer nope", raw]:
            assert client.get(JOBS, HTTP_AUTHORIZATION=header).status_code == 401

    def test_403_without_the_scope(self, client):
        reader = auth(key_for("read"))
        response = client.post(
            JOBS, json.dumps({"task": ADD, "args": [1, 2]}), "application/json", **reader
        )
        assert response.status_code == 403
        assert response.json()["detail"] == "The API key 'svc' does not have the 'enqueue' scope."
        enqueuer = auth(key_for("enqueue", name="writer"))
        assert client.get(JOBS, **enqueuer).status_code == 403
        job = JobFactory(dead=True)
        assert client.post(f"{JOBS}/{job.id}/requeue", **reader).status_code == 403
        assert Job.objects.count() == 1 and Job.objects.get().state == "dead"

    def test_a_bad_key_is_401_even_with_a_staff_session(self, client):
        make_user(client, "conveyor.view_job")
        assert client.get(JOBS).status_code == 200
        assert client.get(JOBS, HTTP_AUTHORIZATION="Bearer cvk_bad").status_code == 401

    def test_staff_sessions_need_the_django_permission(self, client):
        make_user(client, "conveyor.view_job")
        assert client.get(JOBS).status_code == 200
        assert client.get("/conveyor/api/queues").status_code == 403  # needs view_queue
        job = JobFactory(dead=True)
        response = client.post(f"{JOBS}/{job.id}/requeue")
        assert response.status_code == 403
        assert "conveyor.change_job" in response.json()["detail"]

    def test_non_staff_users_cannot_use_a_session(self, client):
        make_user(client, "conveyor.view_job", staff=False)
        assert client.get(JOBS).status_code == 403

    def test_sessions_cannot_enqueue(self, client):
        User.objects.create_superuser("root", "root@example.com", "pw")
        client.login(username="root", password="pw")
        response = client.post(JOBS, json.dumps({"task": ADD, "args": [1, 2]}), "application/json")
        assert response.status_code == 401
        assert Job.objects.count() == 0

    def test_session_writes_pass_the_csrf_check_and_keys_are_exempt(self):
        strict = Client(enforce_csrf_checks=True)
        make_user(strict, "conveyor.change_job")
        job = JobFactory(dead=True)
        refused = strict.post(f"{JOBS}/{job.id}/requeue")
        assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
        assert Job.objects.get(pk=job.id).state == "dead"
        strict.get("/conveyor/api/docs")  # the docs page hands a session its CSRF token
        token = strict.cookies["csrftoken"].value
        accepted = strict.post(f"{JOBS}/{job.id}/requeue", HTTP_X_CSRFTOKEN=token)
        assert accepted.status_code == 200 and accepted.json()["state"] == "available"

        keyed = Client(enforce_csrf_checks=True)
        response = keyed.post(
            JOBS, json.dumps({"task": ADD, "args": [1, 2]}), "application/json",
            **auth(key_for("enqueue")),
        )  # fmt: skip
        assert response.status_code == 201

    def test_keys_are_stored_hashed_and_never_logged(self, client, caplog):
        raw = key_for("enqueue", "read")
        row = ApiKey.objects.values().get()
        assert raw not in json.dumps(row, default=str)
        assert row["secret_hash"] == keys.hash_key(raw) and len(row["secret_hash"]) == 64
        assert raw.startswith(f"cvk_{row['prefix']}_")
        with caplog.at_level("DEBUG"), override_settings(DEBUG=True):
            client.get(JOBS, **auth(raw))
            client.get(JOBS, HTTP_AUTHORIZATION=f"Token {raw}")
            client.get(JOBS, HTTP_AUTHORIZATION=f"Bearer {raw}x")
        assert raw not in caplog.text
        assert ApiKey.objects.get().last_used_at is not None


class TestReading:
    def test_get_a_job_with_its_errors(self, api):
        job = JobFactory(dead=True)
        body = api.get(f"{JOBS}/{job.id}").json()
        assert (body["state"], body["attempt"], len(body["errors"])) == ("dead", 3, 3)
        assert body["errors"][0]["exception_class_path"] == "builtins.ValueError"

    def test_404_for_a_missing_job(self, api):
        for job_id in ["999", "nope", "elsewhere:1"]:
            assert api.get(f"{JOBS}/{job_id}").status_code == 404

    def test_filters(self, api):
        JobFactory.create_batch(2, dead=True)
        JobFactory(dead=True, queue="emails", task_path="tests.testapp.tasks.send_email")
        JobFactory(completed=True)
        JobFactory(queue="emails")

        def ids(**params):
            return [j["id"] for j in api.get(JOBS, **params).json()["items"]]

        assert len(ids()) == 5
        assert len(ids(state="dead")) == 3
        assert len(ids(queue="emails")) == 2
        assert len(ids(state="dead", queue="emails")) == 1
        assert len(ids(task="tests.testapp.tasks.send_email")) == 1
        assert len(ids(state="dead", task=ADD)) == 2
        assert ids() == sorted(ids(), key=int, reverse=True)

    def test_pages_are_stable_while_jobs_are_added(self, api):
        JobFactory.create_batch(25)
        before = set(Job.objects.values_list("id", flat=True))
        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": 10, **({"cursor": cursor} if cursor else {})}
            page = api.get(JOBS, **params).json()
            seen += [j["id"] for j in page["items"]]
            JobFactory.create_batch(3)  # inserts between pages never shift the next one
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == len(set(seen)) == 25
        assert {int(i) for i in seen} == before

    def test_pages_by_queue_and_by_state_walk_every_matching_job(self, api):
        for state in ("available", "dead", "completed"):
            for queue in ("default", "emails"):
                JobFactory.create_batch(4, **{state: True} if state != "available" else {},
                                        queue=queue)  # fmt: skip
        for params, expected in [({"queue": "emails"}, 12), ({"state": "dead"}, 8)]:
            seen, cursor = [], None
            while True:
                page = api.get(JOBS, limit=3, **params, **({"cursor": cursor} if cursor else {}))
                seen += page.json()["items"]
                cursor = page.json()["next_cursor"]
                if not cursor:
                    break
            assert len(seen) == len({j["id"] for j in seen}) == expected
            assert [int(j["id"]) for j in seen] == sorted((int(j["id"]) for j in seen),
                                                          reverse=True)  # fmt: skip

    def test_bad_query_parameters(self, api):
        assert field_errors(api.get(JOBS, state="bogus"))["state"].startswith("Input should be")
        assert field_errors(api.get(JOBS, limit=0)) == {
            "limit": "Input should be greater than or equal to 1."
        }
        assert field_errors(api.get(JOBS, cursor="!!")) == {
            "cursor": "The cursor is not one this API returned."
        }


class TestOperating:
    @pytest.mark.parametrize("state", ["failed", "dead", "cancelled"])
    def test_requeue(self, api, state):
        job = JobFactory(**{state: True})
        response = api.post(f"{JOBS}/{job.id}/requeue")
        assert response.status_code == 200
        assert response.json()["state"] == "available"
        assert Job.objects.get(pk=job.id).attempt == 0

    @pytest.mark.parametrize("state", ["available", "running", "completed", "blocked"])
    def test_requeue_is_409_unless_failed_dead_or_cancelled(self, api, state):
        job = JobFactory(**({state: True} if state != "available" else {}))
        response = api.post(f"{JOBS}/{job.id}/requeue")
        assert response.status_code == 409
        assert response.json()["detail"] == (
            f"Job {job.id} is {state}; only jobs that are failed, dead or cancelled can be "
            "requeued."
        )
        assert Job.objects.get(pk=job.id).state == state

    @pytest.mark.parametrize("state", ["available", "blocked"])
    def test_cancel(self, api, state):
        job = JobFactory(**({state: True} if state != "available" else {}))
        response = api.post(f"{JOBS}/{job.id}/cancel")
        assert response.status_code == 200 and response.json()["state"] == "cancelled"

    def test_cancel_of_a_running_job_asks_its_worker_with_202(self, api):
        job = JobFactory(running=True)
        response = api.post(f"{JOBS}/{job.id}/cancel")
        assert response.status_code == 202, response.content
        body = response.json()
        assert (body["state"], body["cancel_requested_by"]) == ("running", "api:svc")
        assert body["cancel_requested_at"] is not None
        row = Job.objects.get(pk=job.id)
        assert [(h["action"], h["actor"]) for h in row.history] == [("request_cancel", "api:svc")]
        # Asking again is answered the same, and the first request stands.
        again = api.post(f"{JOBS}/{job.id}/cancel")
        assert again.status_code == 202
        assert again.json()["cancel_requested_at"] == body["cancel_requested_at"]
        assert len(Job.objects.get(pk=job.id).history) == 1

    @pytest.mark.parametrize("state", ["completed", "failed", "dead", "cancelled"])
    def test_cancel_is_409_once_finished(self, api, state):
        job = JobFactory(**{state: True})
        response = api.post(f"{JOBS}/{job.id}/cancel")
        assert response.status_code == 409
        assert response.json()["detail"] == (
            f"Job {job.id} is {state}; only jobs that are blocked, available or running can be "
            "cancelled."
        )
        assert Job.objects.get(pk=job.id).state == state

    def test_404_for_operations_on_a_missing_job(self, api):
        assert api.post(f"{JOBS}/999/requeue").status_code == 404
        assert api.post(f"{JOBS}/999/cancel").status_code == 404

    def test_operations_are_logged_with_the_actor_never_the_key(self, api, caplog):
        job = JobFactory(dead=True)
        with caplog.at_level("INFO", logger="django_conveyor.api"):
            api.post(f"{JOBS}/{job.id}/requeue")
        assert f"api:svc requeued job {job.id}" in caplog.text
        assert "cvk_" not in caplog.text
        assert Job.objects.get(pk=job.id).history[-1]["actor"] == "api:svc"

    def test_queues_pause_and_resume(self, api):
        JobFactory.create_batch(2, queue="emails")
        JobFactory(dead=True, queue="emails")
        queues = {q["name"]: q for q in api.get("/conveyor/api/queues").json()}
        assert set(queues) >= {"default", "emails", "slow", "other"}
        assert queues["emails"]["jobs"]["available"] == 2
        assert queues["emails"]["jobs"]["dead"] == 1
        paused = api.post("/conveyor/api/queues/emails/pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        assert Queue.objects.get(name="emails").paused
        resumed = api.post("/conveyor/api/queues/emails/resume")
        assert resumed.json()["paused"] is False
        assert api.post("/conveyor/api/queues/nope/pause").status_code == 404


class TestSchemaAndDocs:
    def test_openapi_schema_describes_every_endpoint(self, client):
        schema = client.get("/conveyor/api/openapi.json").json()
        assert schema["openapi"].startswith("3.")
        operations = {
            (method, path): op
            for path, item in schema["paths"].items()
            for method, op in item.items()
        }
        assert set(operations) == {
            ("post", "/conveyor/api/jobs"),
            ("get", "/conveyor/api/jobs"),
            ("get", "/conveyor/api/jobs/{job_id}"),
            ("get", "/conveyor/api/jobs/{job_id}/logs"),
            ("post", "/conveyor/api/jobs/{job_id}/requeue"),
            ("post", "/conveyor/api/jobs/{job_id}/cancel"),
            ("post", "/conveyor/api/jobs/{job_id}/signal"),
            ("get", "/conveyor/api/queues"),
            ("post", "/conveyor/api/queues/{name}/pause"),
            ("post", "/conveyor/api/queues/{name}/resume"),
            ("put", "/conveyor/api/queues/{name}/limits"),
        }
        enqueue = operations[("post", "/conveyor/api/jobs")]
        assert {"200", "201", "400", "401", "403", "409"} <= set(enqueue["responses"])
        assert [p["name"] for p in enqueue["parameters"]] == ["Idempotency-Key"]
        assert schema["components"]["securitySchemes"]["ApiKeyAuth"] == {
            "type": "http", "scheme": "bearer"
        }  # fmt: skip

    def test_docs_page_uses_only_local_assets(self, client):
        page = client.get("/conveyor/api/docs").content.decode()
        assert "http://" not in page and "https://" not in page
        for asset in ("swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-init.js"):
            url = f"/conveyor/api/docs/assets/{asset}"
            assert url in page
            response = client.get(url)
            assert response.status_code == 200
            assert b"".join(response.streaming_content)
        assert client.get("/conveyor/api/docs/assets/..%2Fsettings.py").status_code == 404


@pytest.mark.django_db(transaction=True, databases=["default", "shard"])
def test_over_a_real_socket(live_server):
    """One live-server run: enqueue, replay, read and a worker completing the job."""
    raw = key_for("enqueue", "read")

    def call(method, path, body=None, key="live-1"):
        request = urllib.request.Request(
            live_server.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {raw}", "Content-Type": "application/json",
                     "Idempotency-Key": key},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read())

    status, headers, job = call("POST", JOBS, {"task": ADD, "args": [20, 22]})
    assert status == 201 and headers["Location"] == f"{JOBS}/{job['id']}"
    status, _, again = call("POST", JOBS, {"task": ADD, "args": [20, 22]})
    assert (status, again["id"]) == (200, job["id"])
    status, _, _ = call("POST", JOBS, {"task": ADD, "args": [20, 23]})
    assert status == 409
    worker = threading.Thread(target=run_burst)
    worker.start()
    worker.join(30)
    status, _, done = call("GET", headers["Location"])
    assert (status, done["state"], done["return_value"]) == (200, "completed", 42)


@pytest.mark.parametrize(
    ("query", "field"),
    [("queue=%00", "queue"), ("task=a%00b", "task"), ("state=completed&queue=x%00", "queue")],
)
def test_a_list_filter_postgresql_cannot_hold_is_a_400_over_http(live_server, query, field):
    raw = key_for("read")
    request = urllib.request.Request(
        f"{live_server.url}{JOBS}?{query}", headers={"Authorization": f"Bearer {raw}"}
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 400
    problem = json.loads(caught.value.read())
    assert [(e["field"], e["location"]) for e in problem["errors"]] == [(field, "query")]
