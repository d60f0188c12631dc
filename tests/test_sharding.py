"""Queues sharded across database aliases (DESIGN §7)."""

import pytest
from django.db import transaction

from django_conveyor.compat import TaskResultDoesNotExist, task_backends
from django_conveyor.models import Job
from django_conveyor.worker.config import WorkerOptions
from django_conveyor.worker.loop import Worker
from tests.helpers import run_burst
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


def test_a_sharded_queue_lives_in_its_alias():
    result = tasks.add.using(queue_name="other").enqueue(2, 2)
    assert result.id.startswith("shard:")
    assert Job.objects.using("shard").count() == 1
    assert Job.objects.using("default").count() == 0
    run_burst(queues=("other",))
    result.refresh()
    assert result.return_value == 4


def test_transactional_enqueue_holds_within_the_alias():
    with pytest.raises(RuntimeError), transaction.atomic(using="shard"):
        tasks.add.using(queue_name="other").enqueue(1, 1)
        raise RuntimeError
    assert Job.objects.using("shard").count() == 0


def test_ids_do_not_collide_across_shards():
    main = tasks.add.enqueue(1, 1)
    shard = tasks.add.using(queue_name="other").enqueue(1, 1)
    assert main.id != shard.id
    backend = task_backends["default"]
    assert backend.get_result(main.id).state == "available"
    assert backend.get_result(shard.id).state == "available"
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("nowhere:1")


def test_a_worker_never_spans_databases():
    with pytest.raises(Exception, match=r"span several: default on 'default'; other on 'shard'"):
        Worker(WorkerOptions(queues=("default", "other")))


def test_pausing_a_sharded_queue_pauses_it_where_workers_claim():
    from django_conveyor import operations
    from django_conveyor.models import Queue

    result = tasks.add.using(queue_name="other").enqueue(1, 2)
    operations.pause(["other"])
    assert Queue.objects.using("shard").get(name="other").paused
    worker = run_burst(queues=("other",))
    assert worker.counters.counts["claimed"] == 0
    operations.resume(["other"])
    run_burst(queues=("other",))
    result.refresh()
    assert result.return_value == 3


def test_a_sharded_jobs_context_knows_its_alias():
    result = tasks.apply_once.using(queue_name="other").enqueue("x")
    run_burst(queues=("other",))
    result.refresh()
    from django_conveyor.models import LedgerEntry

    entry = LedgerEntry.objects.using("shard").get()
    assert str(entry.job_id) == result.id.split(":")[1]
