"""ENQUEUE's input: one typed array per column, for one call as for thousands.

Each column travels as the text of an array (protocol._array), so a value
that array syntax must escape has to come back as it went in, and a column
that only some calls set has to stay with its own rows. The cursor that
sends it binds on the server only when the connection keeps prepared
statements (backend.enqueue_cursor).
"""

import pytest
from django.db import connection, transaction

from django_conveyor.backend import enqueue_cursor
from django_conveyor.exceptions import IdempotencyKeyReused
from django_conveyor.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

# What array syntax quotes or escapes, and what it reads specially when bare.
AWKWARD = ['a"b', "back\\slash", '\\"', "{brace}", "comma,sep", "NULL", "", " spaced ", "o'k", "ü€"]


class TestTypedArrays:
    def test_awkward_text_comes_back_as_sent_one_call_at_a_time(self):
        for i, text in enumerate(AWKWARD):
            result = tasks.add.using(
                idempotency_key=f"k{i}{text}", concurrency_key=f"c{i}{text}"
            ).enqueue(text, b={text: [text]})
            job = Job.objects.get(pk=result.id)
            assert (job.args, job.kwargs) == ([text], {"b": {text: [text]}})
            assert (job.idempotency_key, job.concurrency_key) == (f"k{i}{text}", f"c{i}{text}")

    def test_awkward_text_comes_back_as_sent_in_one_bulk_call(self):
        calls = [
            ((text,), {"b": {text: text}}, {"idempotency_key": f"k{i}{text}"})
            for i, text in enumerate(AWKWARD)
        ]
        results = tasks.add.using(tags=["t\\", 't"'], meta={"m": AWKWARD}).enqueue_many(calls)
        jobs = {job.id: job for job in Job.objects.all()}
        for i, (text, result) in enumerate(zip(AWKWARD, results, strict=True)):
            job = jobs[int(result.id)]
            assert (job.args, job.kwargs, job.idempotency_key) == (
                [text],
                {"b": {text: text}},
                f"k{i}{text}",
            )
            assert (job.tags, job.meta["m"]) == (["t\\", 't"'], AWKWARD)

    def test_a_column_only_some_calls_set_stays_with_their_rows(self):
        calls = [
            ((1, 0), {}),
            ((2, 0), {}, {"idempotency_key": "only-the-second"}),
            ((3, 0), {}, {"concurrency_key": "only-the-third"}),
            ((4, 0), {}),
        ]
        results = tasks.add.enqueue_many(calls)
        rows = [
            Job.objects.values_list("args", "idempotency_key", "concurrency_key").get(pk=r.id)
            for r in results
        ]
        assert rows == [
            ([1, 0], None, None),
            ([2, 0], "only-the-second", None),
            ([3, 0], None, "only-the-third"),
            ([4, 0], None, None),
        ]
        assert [int(r.id) for r in results] == sorted(int(r.id) for r in results)  # call order

    def test_a_refused_call_leaves_nothing_of_its_bulk_call(self):
        tasks.add.using(idempotency_key="taken").enqueue(1, 2)
        calls = [((5, 5), {}), ((6, 6), {}, {"idempotency_key": "taken"}), ((7, 7), {})]
        with pytest.raises(IdempotencyKeyReused, match="Idempotency key 'taken' already names"):
            tasks.add.enqueue_many(calls)
        assert list(Job.objects.values_list("args", flat=True)) == [[1, 2]]


def prepared_enqueues() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%INSERT INTO conveyor_job%"],
        )
        return cursor.fetchone()[0]


class TestEnqueueCursor:
    def test_without_prepared_statements_it_is_djangos_client_side_cursor(self):
        for _ in range(6):
            tasks.add.enqueue(1, 2)
        assert prepared_enqueues() == 0
        with enqueue_cursor(connection) as cursor:
            assert type(cursor.cursor) is type(connection.cursor().cursor)

    def test_with_a_prepare_threshold_enqueue_is_prepared_and_still_observed(self):
        connection.ensure_connection()
        connection.connection.prepare_threshold = 2
        seen = []

        def wrapper(execute, sql, params, many, context):
            seen.append(sql)
            return execute(sql, params, many, context)

        try:
            with connection.execute_wrapper(wrapper), transaction.atomic():
                results = [tasks.add.enqueue(i, 2) for i in range(4)]
            assert prepared_enqueues() == 1
            assert sum("INSERT INTO conveyor_job" in sql for sql in seen) == 4
            assert [Job.objects.get(pk=r.id).args for r in results] == [[i, 2] for i in range(4)]
        finally:
            connection.close()  # The next test gets a connection as Django makes it.
