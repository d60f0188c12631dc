"""Enqueueing: transactional, idempotent, validated, ordered; results readable."""

import datetime as dt

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_conveyor.compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
)
from django_conveyor.dbconn import connect
from django_conveyor.exceptions import ArgumentsNotSerializable, IdempotencyKeyReused
from django_conveyor.models import Job
from django_conveyor.tasks import task
from tests.factories import JobFactory
from tests.helpers import direct_dsn, run_burst
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener():
    with connect("default", dsn=direct_dsn()) as conn:  # LISTEN needs a direct connection
        conn.execute("LISTEN conveyor")
        yield conn


class TestTransactionalEnqueue:
    def test_commit_keeps_the_job_and_notifies(self, listener):
        with transaction.atomic():
            Effect.objects.create(job_id=0, token=0, worker="", label="order")
            result = tasks.send_email.enqueue("a@example.com")
            assert list(listener.notifies(timeout=0.3)) == []  # not before commit
        notes = list(listener.notifies(timeout=2.0, stop_after=1))
        assert [n.payload for n in notes] == ["emails"]
        assert Job.objects.filter(pk=result.id, queue="emails", state="available").exists()
        assert Effect.objects.filter(label="order").count() == 1

    def test_rollback_leaves_no_job_and_no_notification(self, listener):
        with pytest.raises(RuntimeError), transaction.atomic():
            Effect.objects.create(job_id=0, token=0, worker="", label="order")
            tasks.send_email.enqueue("a@example.com")
            raise RuntimeError("the order failed")
        assert Job.objects.count() == 0
        assert Effect.objects.count() == 0
        assert list(listener.notifies(timeout=0.5)) == []

    def test_deferred_job_does_not_notify(self, listener):
        later = timezone.now() + dt.timedelta(hours=1)
        tasks.add.using(run_after=later).enqueue(1, 1)
        assert list(listener.notifies(timeout=0.5)) == []


class TestIdempotentEnqueue:
    def test_same_key_twice_gives_one_job(self):
        first = tasks.add.using(idempotency_key="order-7").enqueue(1, 2)
        second = tasks.add.using(idempotency_key="order-7").enqueue(1, 2)
        assert first.created is True
        assert second.created is False
        assert second.id == first.id
        assert Job.objects.filter(idempotency_key="order-7").count() == 1

    @pytest.mark.parametrize(
        ("call", "what"),
        [
            (lambda: tasks.add.using(idempotency_key="order-7").enqueue(5, 5), "arguments"),
            (lambda: tasks.add.using(idempotency_key="order-7").enqueue(1, b=2), "arguments"),
            (lambda: tasks.noop.using(idempotency_key="order-7").enqueue(1, 2), "task"),
            (
                lambda: tasks.add.using(idempotency_key="order-7", queue_name="emails").enqueue(
                    1, 2
                ),
                "queue",
            ),
        ],
    )
    def test_same_key_for_another_operation_is_refused(self, call, what):
        first = tasks.add.using(idempotency_key="order-7").enqueue(1, 2)
        with transaction.atomic():
            with pytest.raises(
                IdempotencyKeyReused, match=rf"job {first.id} .*differs in its {what}\b"
            ):
                call()
            # The caller's transaction is still usable.
            assert Job.objects.filter(idempotency_key="order-7").count() == 1
        assert Job.objects.count() == 1

    def test_key_in_a_rolled_back_transaction_is_free_again(self):
        with pytest.raises(RuntimeError), transaction.atomic():
            tasks.add.using(idempotency_key="k").enqueue(1, 2)
            raise RuntimeError
        again = tasks.add.using(idempotency_key="k").enqueue(1, 2)
        assert again.created is True
        assert Job.objects.count() == 1

    def test_key_must_be_a_short_string(self):
        with pytest.raises(InvalidTask, match="idempotency_key must be a non-empty string"):
            tasks.add.using(idempotency_key="x" * 256).enqueue(1, 2)
        assert Job.objects.count() == 0


class TestEnqueueMany:
    def test_many_calls_in_one_statement(self):
        results = tasks.add.enqueue_many([((i, i), {}) for i in range(50)])
        assert len(results) == 50
        assert len({r.id for r in results}) == 50
        rows = dict(Job.objects.values_list("id", "args"))
        assert all(rows[int(r.id)] == [i, i] for i, r in enumerate(results))

    def test_empty_is_empty(self):
        assert tasks.add.enqueue_many([]) == []


class TestBadInput:
    def test_arguments_must_be_json(self):
        with pytest.raises(
            ArgumentsNotSerializable,
            match=r"add\(\) args\[1\]\['when'\] is not JSON-serializable: datetime",
        ):
            tasks.add.enqueue(1, {"when": timezone.now()})
        assert Job.objects.count() == 0

    def test_unknown_queue_is_named(self):
        with pytest.raises(InvalidTask, match="Queue 'nope' is not valid"):
            tasks.add.using(queue_name="nope").enqueue(1, 2)
        assert Job.objects.count() == 0

    def test_task_must_be_module_level(self):
        def local(x):
            return x

        with pytest.raises(InvalidTask, match="module level"):
            task(local)

    def test_max_attempts_must_be_positive(self):
        with pytest.raises(InvalidTask, match="max_attempts must be a whole number of 1 or more"):
            tasks.add.using(max_attempts=0)

    def test_per_task_options_cannot_change_per_call(self):
        with pytest.raises(TypeError, match="timeout apply to every call of a task"):
            tasks.add.using(timeout=5)

    def test_unknown_task_option(self):
        with pytest.raises(TypeError, match="Unknown task option"):
            task(retries=3)

    def test_priority_range(self):
        with pytest.raises(InvalidTask, match="priority"):
            tasks.add.using(priority=101)


class TestOrdering:
    def test_priority_then_run_after_then_id(self):
        now = timezone.now()
        tasks.ordered.using(run_after=now - dt.timedelta(seconds=5)).enqueue("old-low")
        tasks.ordered.using(priority=50).enqueue("high")
        tasks.ordered.enqueue("new-low")
        tasks.ordered.using(priority=-50).enqueue("lowest")
        run_burst(concurrency=1, prefetch=0)
        labels = list(Effect.objects.order_by("id").values_list("label", flat=True))
        assert labels == ["high", "old-low", "new-low", "lowest"]

    def test_run_after_in_future_is_not_claimed(self):
        later = timezone.now() + dt.timedelta(hours=1)
        result = tasks.add.using(run_after=later).enqueue(1, 1)
        tasks.add.enqueue(2, 2)
        worker = run_burst()
        assert worker.stats.counts["completed"] == 1
        assert Job.objects.get(pk=result.id).state == "available"

    def test_naive_run_after_is_refused(self):
        with pytest.raises(InvalidTask, match="aware"):
            tasks.add.using(run_after=dt.datetime(2030, 1, 1)).enqueue(1, 1)


class TestGetResult:
    @pytest.mark.parametrize(
        ("trait", "status"),
        [
            ("blocked", TaskResultStatus.READY),
            (None, TaskResultStatus.READY),
            ("running", TaskResultStatus.RUNNING),
            ("completed", TaskResultStatus.SUCCESSFUL),
            ("failed", TaskResultStatus.FAILED),
            ("dead", TaskResultStatus.FAILED),
            ("cancelled", TaskResultStatus.FAILED),
        ],
    )
    def test_each_state_maps_to_a_status(self, trait, status):
        job = JobFactory(**({trait: True} if trait else {}))
        result = tasks.add.get_result(str(job.id))
        assert result.status == status
        assert result.state == job.state
        assert result.args == [1, 2]
        if trait == "completed":
            assert result.return_value == 3
            assert result.worker_ids == ["worker-a"]
        if trait == "dead":
            assert result.attempts == 3
            assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 3
            assert result.errors[0].exception_class is ValueError
            with pytest.raises(ValueError, match="Task failed"):
                result.return_value  # noqa: B018

    def test_missing_result(self):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result("123456789")
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result("not-a-number")

    def test_refresh_follows_the_job(self):
        result = tasks.add.enqueue(20, 22)
        assert result.status == TaskResultStatus.READY
        run_burst()
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == 42
        assert result.attempts == 1


class TestAsync:
    def test_aenqueue_and_async_task(self):
        import asyncio

        from asgiref.sync import sync_to_async
        from django.db import connections

        async def go():
            try:
                return await tasks.async_add.aenqueue(4, 5)
            finally:  # aenqueue ran on asgiref's thread: close its connection
                await sync_to_async(connections.close_all)()

        result = asyncio.run(go())
        run_burst()
        result.refresh()
        assert result.return_value == 9


def test_enqueue_uses_the_callers_connection():
    with transaction.atomic():
        result = tasks.add.enqueue(1, 1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT state FROM conveyor_job WHERE id = %s", [int(result.id)])
            assert cursor.fetchone() == ("available",)
        with connect("default") as other:
            assert other.execute("SELECT count(*) FROM conveyor_job").fetchone() == (0,)
