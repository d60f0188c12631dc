"""Tags and metadata (docs/observability.md#tags-and-metadata): validated at every edge,
stored as NULL when empty, and returned wherever a job is."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_conveyor import testing
from django_conveyor.api import keys
from django_conveyor.compat import InvalidTask
from django_conveyor.models import Job
from django_conveyor.periodic.ticks import tick_job
from tests.testapp import observe_tasks as t
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])

JOBS = "/conveyor/api/jobs"


def row(result) -> tuple:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tags, meta FROM conveyor_job WHERE id = %s", [int(result.id)])
        tags, meta = cursor.fetchone()
    return (json.loads(tags) if tags else tags), (json.loads(meta) if meta else meta)


def test_tags_are_the_tasks_then_the_calls_without_duplicates_and_meta_merges():
    job = t.tagged.using(tags=["tenant:42", "observe"]).using(tags=["import"]).enqueue("x")
    assert row(job) == (["observe", "tenant:42", "import"], None)
    assert job.tags == ("observe", "tenant:42", "import")
    merged = tasks.add.using(meta={"a": 1, "b": 2}).using(meta={"b": 3}).enqueue(1, 2)
    assert row(merged) == (None, {"a": 1, "b": 3})
    assert merged.meta == {"a": 1, "b": 3} and merged.tags == ()


def test_a_job_without_labels_stores_null_in_both_columns_even_for_empty_ones():
    plain = tasks.add.enqueue(1, 2)
    empty = tasks.add.using(tags=[], meta={}).enqueue(1, 2)
    assert row(plain) == (None, None) and row(empty) == (None, None)


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ("tenant:42", "tags must be a list of strings, not str"),
        ([42], "Each tag must be a string, not int 42"),
        ([""], "Each tag must be 1 to 64 characters"),
        (["   "], "not only spaces"),
        (["x" * 65], "Each tag must be 1 to 64 characters"),
        ([f"t{i}" for i in range(33)], "A job has at most 32 tags, not 33"),
        (["a\x00b"], "NUL character"),
        (["a\ud800"], "lone surrogate"),
    ],
)
def test_bad_tags_are_refused_naming_the_value_and_nothing_is_written(tags, message):
    before = Job.objects.count()
    with pytest.raises(InvalidTask) as caught:
        tasks.add.using(tags=tags).enqueue(1, 2)
    assert message in str(caught.value)
    assert Job.objects.count() == before


def test_the_tag_limit_counts_the_tasks_tags_too():
    fine = t.tagged.using(tags=[f"t{i}" for i in range(31)]).enqueue("x")  # + "observe": 32
    assert len(fine.tags) == 32
    with pytest.raises(InvalidTask, match="at most 32 tags, not 33"):
        t.tagged.using(tags=[f"t{i}" for i in range(32)])


def module_level():
    return None


def test_bad_task_tags_are_refused_when_the_task_is_declared():
    from django_conveyor import task

    with pytest.raises(InvalidTask, match="Each tag must be a string"):
        task(tags=[1])(module_level)
    with pytest.raises(TypeError, match="meta is per call"):
        task(meta={"a": 1})(module_level)


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (["a"], "meta must be a dict (a JSON object), not list"),
        ({1: "a"}, "key 1"),
        ({"a": float("nan")}, "only finite numbers"),
        ({"a": object()}, "is not JSON-serializable"),
        ({"a": "x\x00"}, "NUL character"),
        ({"a": "x" * 5000}, "meta must be at most 4096 bytes as JSON"),
        ({"traceparent": 7}, "meta['traceparent'] is trace context: a string"),
    ],
)
def test_bad_meta_is_refused_naming_the_value(meta, message):
    with pytest.raises(InvalidTask) as caught:
        tasks.add.using(meta=meta).enqueue(1, 2)
    assert message in str(caught.value)


def test_get_result_refresh_and_the_handlers_context_return_them():
    job = t.labels.using(tags=["tenant:7"], meta={"request_id": "ab12"}).enqueue()
    fetched = t.labels.get_result(job.id)
    assert fetched.tags == ("observe", "labels", "tenant:7")
    assert fetched.meta == {"request_id": "ab12"} and fetched.progress is None
    testing.run_jobs()
    job.refresh()
    assert job.state == "completed"
    assert job.return_value == {
        "tags": ["observe", "labels", "tenant:7"],
        "meta": {"request_id": "ab12"},
    }
    assert job.tags == ("observe", "labels", "tenant:7")


def test_enqueue_many_labels_every_job():
    results = t.tagged.using(tags=["bulk"], meta={"batch": 3}).enqueue_many(
        [(("a",), {}), (("b",), {})]
    )
    assert [row(r) for r in results] == [(["observe", "bulk"], {"batch": 3})] * 2


def test_a_cron_tick_job_carries_the_tasks_tags():
    class Row:
        task_path = "tests.testapp.observe_tasks.tagged"
        args, kwargs, queue, priority = '["tick"]', "{}", "default", 0

    assert tick_job(Row()).tags == ("observe",)


def test_a_bad_row_written_by_hand_shows_no_labels_instead_of_failing():
    job = tasks.add.enqueue(1, 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE conveyor_job SET tags = '\"oops\"', meta = '[1]' WHERE id = %s", [int(job.id)]
        )
    fetched = tasks.add.get_result(job.id)
    assert (fetched.tags, fetched.meta) == ((), {})


class TestApi:
    @pytest.fixture
    def api(self, client):
        headers = {"HTTP_AUTHORIZATION": "Bearer " + keys.create("svc", ["enqueue", "read"])[1]}

        class Api:
            def post(self, body):
                return client.post(JOBS, json.dumps(body), content_type="application/json",
                                   **headers)  # fmt: skip

            def get(self, path):
                return client.get(path, **headers)

        return Api()

    def test_post_stores_them_and_the_job_json_returns_them(self, api):
        response = api.post(
            {"task": "tests.testapp.observe_tasks.tagged", "args": ["x"],
             "tags": ["tenant:42"], "meta": {"request_id": "ab12"}}
        )  # fmt: skip
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["tags"] == ["observe", "tenant:42"] and body["meta"] == {"request_id": "ab12"}
        job = Job.objects.get(pk=int(body["id"]))
        assert (job.tags, job.meta) == (["observe", "tenant:42"], {"request_id": "ab12"})
        again = api.get(f"{JOBS}/{body['id']}").json()
        assert again["tags"] == ["observe", "tenant:42"] and again["meta"] == {"request_id": "ab12"}
        listed = api.get(JOBS).json()["items"][0]
        assert listed["tags"] == ["observe", "tenant:42"]

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("tags", ["x" * 65], "Each tag must be 1 to 64 characters"),
            ("tags", [1], "Each tag must be a string"),
            ("meta", {"a": "x" * 5000}, "at most 4096 bytes"),
            ("meta", {"traceparent": 1}, "trace context"),
        ],
    )
    def test_bad_values_are_a_400_naming_the_field_and_nothing_is_written(
        self, api, field, value, message
    ):
        response = api.post({"task": "tests.testapp.tasks.add", "args": [1, 2], field: value})
        assert response.status_code == 400, response.content
        (error,) = response.json()["errors"]
        assert error["field"] == field and message in error["message"]
        assert not Job.objects.exists()

    def test_openapi_describes_them(self, client):
        schema = client.get("/conveyor/api/openapi.json").json()["components"]["schemas"]
        assert {"tags", "meta"} <= set(schema["EnqueueIn"]["properties"])
        assert {"tags", "meta", "progress"} <= set(schema["JobOut"]["properties"])


def test_the_admin_shows_tags_as_links_to_their_search_and_meta_on_the_job_page(admin_client):
    job = t.tagged.using(tags=["tenant:42"], meta={"request_id": "ab12"}).enqueue("x")
    listing = admin_client.get("/admin/conveyor/job/").content.decode()
    assert "?q=tag%3A%22tenant%3A42%22" in listing and ">tenant:42</a>" in listing
    page = admin_client.get(f"/admin/conveyor/job/{job.id}/change/").content.decode()
    assert "request_id" in page and "ab12" in page and ">observe</a>" in page
