"""Results and signals describe the job as it was enqueued (issue 9, part 2).

`get_result()`, `aget_result()`, `refresh()` and the results that the
django.tasks signals carry rebuild `task.using(...)` from the row: the
enqueued priority, queue, run_after and backend, from any process.
`task_finished` is sent only once the fenced outcome committed.
"""

import json
import subprocess
import sys
import threading
from datetime import UTC, datetime

import pytest
from asgiref.sync import async_to_sync
from django.db.models import F
from django.test import override_settings

from django_conveyor.compat import (
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_conveyor.models import Job
from tests.helpers import REPO, run_burst, wait_until, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EARLIER = datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC)  # Deferred, and already due.


def enqueued_as(task) -> tuple:
    return (task.priority, task.queue_name, task.run_after, task.backend)


@pytest.fixture
def received():
    """Every result each django.tasks signal carried, by signal name."""
    seen: dict[str, list] = {"enqueued": [], "started": [], "finished": []}

    def receiver(name):
        def receive(sender, task_result, **kwargs):
            seen[name].append((sender, task_result, sys.exc_info()[0]))

        return receive

    receivers = {name: receiver(name) for name in seen}
    pairs = [(task_enqueued, "enqueued"), (task_started, "started"), (task_finished, "finished")]
    for signal, name in pairs:
        signal.connect(receivers[name])
    yield seen
    for signal, name in pairs:
        signal.disconnect(receivers[name])


def test_get_result_carries_the_enqueued_priority_queue_and_run_after():
    result = tasks.add.using(priority=7, queue_name="emails", run_after=EARLIER).enqueue(1, 2)
    backend = task_backends["default"]
    for fresh in (backend.get_result(result.id), async_to_sync(backend.aget_result)(result.id)):
        assert enqueued_as(fresh.task) == (7, "emails", EARLIER, "default")
        assert fresh.task.func is tasks.add.func
    result.refresh()
    assert enqueued_as(result.task) == (7, "emails", EARLIER, "default")


def test_an_undeferred_job_has_no_run_after_even_after_a_retry():
    plain = tasks.always_fails.enqueue("boom")
    deferred = tasks.always_fails.using(run_after=EARLIER).enqueue("boom")
    run_burst()
    for result, run_after in ((plain, None), (deferred, EARLIER)):
        row = Job.objects.get(pk=result.id)
        assert row.attempt >= 1 and row.run_after > EARLIER  # The retry moved run_after ...
        assert tasks.always_fails.get_result(result.id).task.run_after == run_after  # ... not it.


def test_a_job_without_changes_returns_the_decorated_task_itself():
    result = tasks.add.enqueue(1, 2)
    assert task_backends["default"].get_result(result.id).task is tasks.add


def test_get_result_carries_the_enqueued_backend():
    second = {"BACKEND": "django_conveyor.backend.ConveyorBackend", "QUEUES": ["default"]}
    with override_settings(TASKS={"default": second, "second": second}):
        result = tasks.add.using(backend="second").enqueue(1, 2)
        fresh = task_backends["default"].get_result(result.id)
        assert fresh.task.backend == fresh.backend == "second"


def test_get_result_from_another_process_describes_the_job_as_enqueued():
    result = tasks.add.using(priority=-3, queue_name="slow", run_after=EARLIER).enqueue(1, 2)
    script = (
        "import json; from django_conveyor.compat import task_backends; "
        f"t = task_backends['default'].get_result({result.id!r}).task; "
        "print(json.dumps([t.priority, t.queue_name, t.run_after.isoformat(), t.backend]))"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", script],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        -3, "slow", EARLIER.isoformat(), "default"
    ]  # fmt: skip


def test_the_signals_carry_the_job_as_enqueued(received):
    result = tasks.add.using(priority=7, queue_name="emails", run_after=EARLIER).enqueue(1, 2)
    run_burst()
    (enqueued,), (started,), (finished,) = (
        received[n] for n in ("enqueued", "started", "finished")
    )
    for sender, task_result, _ in (enqueued, started, finished):
        assert sender is type(task_backends["default"])
        assert task_result.id == result.id
        assert enqueued_as(task_result.task) == (7, "emails", EARLIER, "default")
        assert task_result.backend == "default"
    assert [r.status for _, r, _ in (enqueued, started, finished)] == [
        TaskResultStatus.READY, TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL
    ]  # fmt: skip
    assert finished[1].return_value == 3


def test_task_finished_is_sent_after_the_outcome_committed(received):
    states = []
    task_finished.connect(seen := lambda sender, task_result, **kw: states.append(
        Job.objects.get(pk=task_result.id).state  # Another connection: committed rows only.
    ))  # fmt: skip
    try:
        done = tasks.add.enqueue(1, 2)
        failed = tasks.discard_me.enqueue("no")
        run_burst()
    finally:
        task_finished.disconnect(seen)
    assert sorted(states) == ["completed", "failed"]
    by_id = {r.id: (r.status, exc) for _, r, exc in received["finished"]}
    assert by_id[done.id] == (TaskResultStatus.SUCCESSFUL, None)
    status, exc = by_id[failed.id]
    assert status == TaskResultStatus.FAILED
    assert exc is not None and exc.__name__ == "Discard"  # Sent while handling it, as Django does.


def test_a_refused_outcome_sends_no_task_finished(received):
    tasks.GATE.clear()
    result = tasks.gated.enqueue("late")
    worker = threading.Thread(target=lambda: stats.append(run_burst().counters.counts))
    stats: list[dict] = []
    worker.start()
    try:
        wait_until(lambda: received["started"])
        # Another claim took the job (as after an expired lease): our token is stale.
        Job.objects.filter(pk=result.id).update(
            lease_version=F("lease_version") + 1, lease_owner="another-worker"
        )
    finally:
        tasks.GATE.set()
        worker.join(30)
    assert stats and stats[0].get("stale_outcomes") == 1
    assert received["finished"] == []
    assert Job.objects.get(pk=result.id).state == "running"  # The other holder decides.
