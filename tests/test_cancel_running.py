"""Cancelling a running job, and the worker registry, with real worker processes."""

import signal

import pytest

from django_conveyor import operations
from django_conveyor.api import keys
from django_conveyor.models import Job, Worker
from tests.helpers import kill_group, start_worker, stop_process, wait_until
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(tmp_path):
    procs = []

    def start(*args):
        proc = start_worker("--queues", "default", *args, log=tmp_path / f"w{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        kill_group(proc)


def running(job_id):
    return Job.objects.filter(pk=job_id, state="running").exists()


def test_the_holding_worker_cancels_a_running_job_and_refuses_its_outcome(worker):
    job_id = int(tasks.cancellable.enqueue(60).id)
    proc = worker("--concurrency", "2")
    wait_until(lambda: running(job_id))
    assert operations.request_cancel([job_id], actor="admin:ops") == [job_id]
    wait_until(lambda: Job.objects.get(pk=job_id).state == "cancelled")
    job = Job.objects.get(pk=job_id)
    assert job.return_value is None  # the handler's "ran to the end" was refused
    assert job.errors[-1]["exception_class_path"] == "django_conveyor.exceptions.Cancelled"
    assert job.errors[-1]["traceback"] == "Cancelled while running, at the request of admin:ops."
    assert [h["action"] for h in job.history] == ["request_cancel", "cancel_held"]
    assert job.history[-1]["actor"].startswith("worker:")
    effect = wait_until(lambda: Effect.objects.filter(job_id=job_id).first())
    assert effect.label == "stopped held=False cancel_requested=True"
    follow_up = tasks.add.enqueue(1, 2)  # the worker carries on serving
    wait_until(lambda: Job.objects.get(pk=int(follow_up.id)).state == "completed")
    assert stop_process(proc) == 0


def test_the_api_cancels_a_running_job_of_a_real_worker(worker, client):
    job_id = int(tasks.cancellable.enqueue(60).id)
    proc = worker()
    wait_until(lambda: running(job_id))
    key = keys.create("ops-bot", ["operate"])[1]
    response = client.post(
        f"/conveyor/api/jobs/{job_id}/cancel", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 202, response.content
    assert response.json()["state"] == "running"
    wait_until(lambda: Job.objects.get(pk=job_id).state == "cancelled")
    job = Job.objects.get(pk=job_id)
    assert job.errors[-1]["traceback"] == "Cancelled while running, at the request of api:ops-bot."
    assert [(h["action"], h["actor"].split(":")[0]) for h in job.history] == [
        ("request_cancel", "api"),
        ("cancel_held", "worker"),
    ]
    assert stop_process(proc) == 0


def test_an_async_handler_is_cancelled_with_its_task(worker):
    job_id = int(tasks.async_sleeper.enqueue("async cancelled", 60).id)
    worker()
    wait_until(lambda: running(job_id))
    operations.request_cancel([job_id])
    wait_until(lambda: Job.objects.get(pk=job_id).state == "cancelled")
    # The handler's CancelledError branch records this effect: Task.cancel() reached it.
    wait_until(lambda: Effect.objects.filter(label="async cancelled").exists())
    job = Job.objects.get(pk=job_id)
    assert job.state == "cancelled"
    assert job.return_value is None  # The sleep never finished ("slept" was never stored).
    assert Effect.objects.filter(label="async cancelled").count() == 1


def test_a_worker_registers_refreshes_its_row_and_marks_its_clean_exit(worker):
    proc = worker("--concurrency", "3", "--shutdown-timeout", "0.5")
    row = wait_until(lambda: Worker.objects.first())
    assert (row.pid, row.concurrency, row.queues, row.stopped_at) == (
        proc.pid,
        3,
        ["default"],
        None,
    )
    first_seen = row.last_seen_at
    wait_until(lambda: Worker.objects.get(pk=row.pk).last_seen_at > first_seen)
    tasks.sleeper.enqueue(30)
    wait_until(lambda: Worker.objects.get(pk=row.pk).leases_held == 1)
    assert stop_process(proc, signal.SIGTERM) == 0
    stopped = Worker.objects.get(pk=row.pk)
    assert stopped.stopped_at is not None and stopped.leases_held == 0
