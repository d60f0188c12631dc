"""`django_conveyor.testing`: what a project's own tests use (issue 9, part 5).

Run under each kind of test a Django project has: pytest-django's `db`
(inside a transaction), `transactional_db`, Django's `TestCase` and
`TransactionTestCase`, and the `conveyor` fixture.
"""

import pytest
from django.db import transaction
from django.test import TestCase, TransactionTestCase

from django_conveyor import testing
from django_conveyor.compat import task_finished
from django_conveyor.models import Job, LedgerEntry
from tests.testapp import tasks
from tests.testapp.models import Effect

DATABASES = {"default", "shard"}  # The suite's settings shard the queue "other".


@pytest.mark.django_db(databases=DATABASES)
def test_assertions_see_jobs_of_the_current_transaction():
    with transaction.atomic():
        tasks.add.using(priority=5).enqueue(1, 2)
        tasks.send_email.enqueue("a@example.com")
        found = testing.assert_enqueued(tasks.add, args=(1, 2), priority=5, queue="default")
        assert found.task.priority == 5 and found.args == [1, 2]
        testing.assert_enqueued("tests.testapp.tasks.send_email", kwargs={}, queue="emails")
        testing.assert_not_enqueued(tasks.add, args=[2, 2])
        testing.assert_enqueued(tasks.add, count=1)
        assert [r.task.name for r in testing.enqueued()] == ["add", "send_email"]


@pytest.mark.django_db(databases=DATABASES)
def test_enqueued_lists_jobs_in_the_order_they_were_enqueued():
    tasks.add.enqueue_many([((i, 0), {}) for i in range(12)])  # One instant in a test.
    assert [r.args for r in testing.enqueued(tasks.add)] == [[i, 0] for i in range(12)]


@pytest.mark.django_db(databases=DATABASES)
def test_a_failed_assertion_says_what_is_waiting():
    tasks.add.enqueue(1, 2)
    with pytest.raises(AssertionError) as failure:
        testing.assert_enqueued(tasks.add, args=[9, 9])
    assert str(failure.value) == (
        "Expected a job matching task=tests.testapp.tasks.add, args=[9, 9] waiting to run, "
        "found 0. Waiting: tests.testapp.tasks.add(args=[1, 2], kwargs={}) queue=default "
        "priority=0."
    )
    with pytest.raises(AssertionError, match="Expected no job matching anything"):
        testing.assert_not_enqueued()


@pytest.mark.django_db(databases=DATABASES)
def test_run_jobs_runs_ready_jobs_through_the_protocol_in_the_test_transaction():
    finished = []
    task_finished.connect(receive := lambda sender, task_result, **kw: finished.append(task_result))
    try:
        plain = tasks.record.enqueue("plain")
        guarded = tasks.apply_once.enqueue("guarded")  # context.atomic(): a savepoint here
        ran = testing.run_jobs()
    finally:
        task_finished.disconnect(receive)
    assert ran.completed == 2 and len(ran) == 2
    assert set(Effect.objects.values_list("label", flat=True)) == {"plain", "guarded"}
    row = Job.objects.get(pk=guarded.id)
    assert row.state == "completed" and row.attempt == 1
    assert Effect.objects.get(label="guarded").token == row.lease_version  # Under its token.
    assert LedgerEntry.objects.filter(job_id=row.id).count() == 1
    assert Job.objects.get(pk=plain.id).return_value == "plain"
    assert {r.id for r in finished} == {plain.id, guarded.id}
    testing.assert_not_enqueued()


@pytest.mark.django_db(databases=DATABASES)
def test_retries_wait_for_their_backoff_unless_immediate():
    waits = tasks.always_fails.enqueue("boom")  # max_attempts=3
    ran = testing.run_jobs(until_empty=True)
    assert ran.counts == {"retried": 1}  # The database clock stands still in a test.
    row = Job.objects.get(pk=waits.id)
    assert (row.state, row.attempt, len(row.errors)) == ("available", 1, 1)
    Job.objects.filter(pk=waits.id).delete()
    dies = tasks.always_fails.enqueue("boom")
    ran = testing.run_jobs(until_empty=True, immediate_retries=True)
    assert ran.counts == {"retried": 2, "dead": 1}
    row = Job.objects.get(pk=dies.id)
    assert (row.state, row.attempt, len(row.errors)) == ("dead", 3, 3)


@pytest.mark.django_db(databases=DATABASES)
def test_until_empty_runs_the_jobs_that_jobs_enqueue():
    tasks.enqueues_next.enqueue("a", 2)
    assert testing.run_jobs().completed == 1  # Only what was ready when called.
    assert testing.run_jobs(until_empty=True).completed == 2
    assert sorted(Effect.objects.values_list("label", flat=True)) == ["a", "a+", "a++"]


@pytest.mark.django_db(databases=DATABASES)
def test_run_enqueued_runs_the_blocks_jobs_on_exit():
    with testing.run_enqueued() as ran:
        tasks.enqueues_next.enqueue("x", 1)
        tasks.discard_me.enqueue("no")
        assert len(ran) == 0 and not Effect.objects.exists()
    assert ran.counts == {"completed": 2, "failed": 1}
    assert Effect.objects.count() == 2


@pytest.mark.django_db(databases=DATABASES)
def test_a_handler_whose_statement_fails_leaves_the_test_transaction_usable():
    result = tasks.breaks_its_statement.enqueue()
    ran = testing.run_jobs(until_empty=True, immediate_retries=True)
    assert ran.counts == {"retried": 1, "dead": 1}
    row = Job.objects.get(pk=result.id)
    assert row.state == "dead"
    assert row.errors[0]["exception_class_path"] == "django.db.utils.ProgrammingError"


@pytest.mark.django_db(databases=DATABASES)
def test_a_sharded_job_runs_in_its_own_database():
    result = tasks.add.using(queue_name="other").enqueue(2, 3)
    assert result.id.startswith("shard:")
    assert testing.run_jobs().completed == 1
    assert tasks.add.get_result(result.id).return_value == 5


@pytest.mark.django_db(databases=DATABASES, transaction=True)
def test_the_same_helpers_under_transactional_db():
    tasks.apply_once.enqueue("committed")
    testing.assert_enqueued(tasks.apply_once, args=["committed"])
    assert testing.run_jobs().completed == 1
    assert Effect.objects.get().label == "committed"


@pytest.mark.django_db(databases=DATABASES)
def test_the_conveyor_fixture(conveyor):
    tasks.add.enqueue(1, 1)
    conveyor.assert_enqueued(tasks.add, args=[1, 1])
    assert conveyor.run_jobs().completed == 1
    conveyor.assert_not_enqueued(tasks.add)


class InTestCase(testing.ConveyorAssertions, TestCase):
    databases = DATABASES

    def test_assert_and_run(self):
        tasks.apply_once.enqueue("in TestCase")
        self.assertEnqueued(tasks.apply_once, args=["in TestCase"])
        with testing.run_enqueued() as ran:
            tasks.record.enqueue("in block")
        self.assertEqual(ran.completed, 2)
        self.assertNotEnqueued()
        self.assertEqual(Effect.objects.count(), 2)


class InTransactionTestCase(testing.ConveyorAssertions, TransactionTestCase):
    databases = DATABASES

    def test_assert_and_run(self):
        tasks.apply_once.enqueue("in TransactionTestCase")
        self.assertEnqueued(tasks.apply_once, count=1)
        self.assertEqual(testing.run_jobs().completed, 1)
        self.assertEqual(LedgerEntry.objects.count(), 1)
