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
from django_conveyor.exceptions import ArgumentsNotSerializable, IdempotencyKeyReused
from django_conveyor.models import Job
from django_conveyor.tasks import task
from django_conveyor.worker.connections import connect
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
        with pytest.raises(
            InvalidTask, match="max_attempts must be a whole number from 1 to 2147483647, not 0"
        ):
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
        assert worker.counters.counts["completed"] == 1
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


def deeply_nested(levels):
    value = []
    for _ in range(levels):
        value = [value]
    return value


LATER = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)

# Refused before anything is written: (how to enqueue, exception, the message's words).
REFUSED = {
    "priority True": (
        lambda: tasks.add.using(priority=True).enqueue(1, 2),
        InvalidTask,
        "priority must be a whole number from -100 to 100, not bool True.",
    ),
    "priority str": (
        lambda: tasks.add.using(priority="5").enqueue(1, 2),
        InvalidTask,
        "priority must be a whole number from -100 to 100, not str '5'.",
    ),
    "priority float": (
        lambda: tasks.add.using(priority=1.5).enqueue(1, 2),
        InvalidTask,
        "priority must be a whole number from -100 to 100, not float 1.5.",
    ),
    "priority out of range": (
        lambda: tasks.add.using(priority=101).enqueue(1, 2),
        InvalidTask,
        "priority must be a whole number between -100 and 100.",
    ),
    "run_after str": (
        lambda: tasks.add.using(run_after="2027-01-01").enqueue(1, 2),
        InvalidTask,
        "run_after must be a datetime, not str '2027-01-01'. Parse it first",
    ),
    "run_after timedelta": (
        lambda: tasks.add.using(run_after=dt.timedelta(hours=1)).enqueue(1, 2),
        InvalidTask,
        "run_after must be a datetime, not timedelta",
    ),
    "run_after naive": (
        lambda: tasks.add.using(run_after=dt.datetime(2030, 1, 1)).enqueue(1, 2),
        InvalidTask,
        "run_after must be an aware datetime.",
    ),
    "run_after past the cap": (
        lambda: tasks.add.using(run_after=dt.datetime(9999, 1, 1, tzinfo=dt.UTC)).enqueue(1, 2),
        InvalidTask,
        "run_after must be at most 315360000 seconds (ten years) from now, not 9999-01-01",
    ),
    "args nested 100,000 deep": (
        lambda: tasks.add.enqueue(deeply_nested(100_000), 2),
        ArgumentsNotSerializable,
        "add() args[0]",
    ),
    "NUL in args": (
        lambda: tasks.add.enqueue("a\x00b", 2),
        ArgumentsNotSerializable,
        "add() args[0] contains a NUL character (\\x00), which PostgreSQL cannot store.",
    ),
    "NUL in kwargs": (
        lambda: tasks.add.enqueue(1, b={"note": "x\x00"}),
        ArgumentsNotSerializable,
        "add() kwargs['b']['note'] contains a NUL character (\\x00)",
    ),
    "NUL in a key": (
        lambda: tasks.add.enqueue(1, {"a\x00": 1}),
        ArgumentsNotSerializable,
        "add() args[1] key 'a\\x00' contains a NUL character",
    ),
    "lone surrogate": (
        lambda: tasks.add.enqueue("\ud800", 2),
        ArgumentsNotSerializable,
        "add() args[0] contains a lone surrogate",
    ),
    "NaN in args": (
        lambda: tasks.add.enqueue(float("nan"), 2),
        ArgumentsNotSerializable,
        "add() args[0] is nan, which JSON cannot represent",
    ),
    "infinity in kwargs": (
        lambda: tasks.add.enqueue(1, b=[float("inf")]),
        ArgumentsNotSerializable,
        "add() kwargs['b'][0] is inf, which JSON cannot represent",
    ),
    "not JSON": (
        lambda: tasks.add.enqueue(1, {2, 3}),
        ArgumentsNotSerializable,
        "add() args[1] is not JSON-serializable: set value {2, 3}.",
    ),
    "NUL in the idempotency key": (
        lambda: tasks.add.using(idempotency_key="k\x00").enqueue(1, 2),
        InvalidTask,
        "idempotency_key 'k\\x00' contains a NUL character",
    ),
    "max_attempts past PostgreSQL's integer": (
        lambda: tasks.add.using(max_attempts=2**31).enqueue(1, 2),
        InvalidTask,
        "max_attempts must be a whole number from 1 to 2147483647, not 2147483648.",
    ),
    "enqueue_many with a NUL": (
        lambda: tasks.add.enqueue_many([((1, 2), {}), (("\x00", 2), {})]),
        ArgumentsNotSerializable,
        "add() args[0] contains a NUL character",
    ),
}


class TestRefusedAtTheEdge:
    @pytest.mark.parametrize(("enqueue", "error", "words"), REFUSED.values(), ids=REFUSED)
    def test_refused_before_anything_is_written(self, enqueue, error, words):
        with transaction.atomic():
            Effect.objects.create(job_id=0, token=0, worker="", label="caller's own row")
            with pytest.raises(error) as raised:
                enqueue()
            assert words in str(raised.value)
            # Nothing was sent to PostgreSQL, so the caller's transaction goes on.
            assert Job.objects.count() == 0
            tasks.add.enqueue(1, 2)
        assert Job.objects.count() == 1
        assert Effect.objects.count() == 1

    def test_nesting_up_to_the_limit_is_accepted(self):
        from django_conveyor.serialization import MAX_DEPTH

        result = tasks.add.enqueue(deeply_nested(MAX_DEPTH - 1), 2)
        assert Job.objects.get(pk=result.id).args[0] == deeply_nested(MAX_DEPTH - 1)
        with pytest.raises(ArgumentsNotSerializable, match="nests more than 100 levels"):
            tasks.add.enqueue(deeply_nested(MAX_DEPTH), 2)

    def test_a_run_after_within_the_cap_is_accepted(self):
        result = tasks.add.using(run_after=LATER).enqueue(1, 2)
        assert Job.objects.get(pk=result.id).run_after == LATER

    @pytest.mark.parametrize(
        ("option", "value"),
        [("backoff_base", 1e300), ("backoff_cap", float("inf")), ("timeout", float("nan"))],
    )
    def test_task_options_past_what_postgresql_holds_are_refused(self, option, value):
        with pytest.raises(InvalidTask, match=rf"{option} must be a positive number of seconds"):
            task(**{option: value})(tasks.add.func)
