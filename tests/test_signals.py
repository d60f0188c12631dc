"""The worker sends django.tasks' signals whenever anything can observe them.

It skips building an attempt's TaskResult only when the sole receivers are
django.tasks' own log lines and their level is off (what a fast deployment
configures); any receiver, or the log level on, brings everything back.
"""

import logging
import queue

import pytest

from django_conveyor.compat import (
    TaskResultStatus,
    log_task_started,
    task_enqueued,
    task_finished,
    task_started,
    tasks_logger,
)
from django_conveyor.signals import heard
from django_conveyor.worker.handlers import executor
from tests.helpers import run_burst
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tasks_log_level():
    before = tasks_logger.level

    def set_level(level: int) -> None:
        tasks_logger.setLevel(level)

    yield set_level
    tasks_logger.setLevel(before)


@pytest.fixture
def results_built(monkeypatch):
    built = []
    original = executor.running_result

    def counting(task, held):
        built.append(held.lease.id)
        return original(task, held)

    monkeypatch.setattr(executor, "running_result", counting)
    return built


def test_a_receiver_gets_both_signals_whatever_the_log_level(tasks_log_level):
    tasks_log_level(logging.WARNING)
    seen = []

    def started(sender, task_result, **kwargs):
        seen.append(("started", task_result.id, task_result.status))

    def finished(sender, task_result, **kwargs):
        seen.append(("finished", task_result.id, task_result.status))

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        ok = tasks.add.enqueue(1, 2)
        bad = tasks.discard_me.enqueue("no")
        run_burst()
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    assert sorted(seen) == sorted(
        [
            ("started", ok.id, TaskResultStatus.RUNNING),
            ("finished", ok.id, TaskResultStatus.SUCCESSFUL),
            ("started", bad.id, TaskResultStatus.RUNNING),
            ("finished", bad.id, TaskResultStatus.FAILED),
        ]
    )


def test_the_log_lines_are_written_when_their_level_is_on(tasks_log_level, caplog):
    tasks_log_level(logging.INFO)
    with caplog.at_level(logging.INFO, logger=tasks_logger.name):
        result = tasks.add.enqueue(1, 2)
        run_burst()
    lines = [r.getMessage() for r in caplog.records if r.name == tasks_logger.name]
    assert f"Task id={result.id} path=tests.testapp.tasks.add state=RUNNING" in lines
    assert f"Task id={result.id} path=tests.testapp.tasks.add state=SUCCESSFUL" in lines


def test_nothing_is_built_when_nothing_listens(tasks_log_level, results_built, caplog):
    tasks_log_level(logging.WARNING)
    assert not heard(task_started, log_task_started, logging.INFO)
    ok = tasks.add.enqueue(1, 2)
    with caplog.at_level(logging.WARNING, logger=tasks_logger.name):
        bad = tasks.discard_me.enqueue("no")
        run_burst()
    # The success built nothing; the failure is logged at ERROR, which is on.
    assert results_built == [int(bad.id)]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert f"Task id={bad.id} path=tests.testapp.tasks.discard_me state=FAILED" in errors
    ok.refresh()
    assert ok.status == TaskResultStatus.SUCCESSFUL


def test_a_context_still_gets_its_result(tasks_log_level, results_built):
    tasks_log_level(logging.WARNING)
    result = tasks.fails_then_succeeds.enqueue(0)
    run_burst()
    result.refresh()
    assert result.return_value == 1
    assert results_built == [int(result.id)]


def test_the_reporter_thread_is_not_woken_when_nothing_can_hear(tasks_log_level, monkeypatch):
    """A cycle's outcomes reach the reporting thread as one batch, or not at all."""
    from django_conveyor.worker.handlers.reporting import Reporter

    batches = []

    class Recording(queue.SimpleQueue):
        def put(self, batch, *args, **kwargs):
            if batch is not None:
                batches.append([o.attempt.lease.id for o in batch])
            super().put(batch, *args, **kwargs)

    original = Reporter.__init__

    def recording(self):
        original(self)
        self.written = Recording()

    monkeypatch.setattr(Reporter, "__init__", recording)
    tasks_log_level(logging.CRITICAL)  # Not even a failure's ERROR line is on.
    tasks.add.enqueue(1, 2)
    tasks.discard_me.enqueue("no")
    run_burst()
    assert batches == []

    tasks_log_level(logging.WARNING)  # A failure's ERROR line is on, a success's INFO not.
    tasks.add.enqueue(1, 2)
    failed = tasks.discard_me.enqueue("no")
    run_burst()
    assert batches == [[int(failed.id)]]
    batches.clear()

    seen = []

    def finished(sender, task_result, **kwargs):
        seen.append(int(task_result.id))

    task_finished.connect(finished)
    try:
        first = tasks.add.enqueue(1, 2)
        second = tasks.add.enqueue(3, 4)
        run_burst(concurrency=1)
    finally:
        task_finished.disconnect(finished)
    assert sorted(seen) == sorted([int(first.id), int(second.id)])
    assert sorted(job for batch in batches for job in batch) == sorted(seen)


def test_enqueue_sends_task_enqueued_to_a_receiver(tasks_log_level):
    tasks_log_level(logging.WARNING)
    seen = []

    def enqueued(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(enqueued)
    try:
        one = tasks.add.enqueue(1, 2)
        many = tasks.add.get_backend().enqueue_many(tasks.add, [((1, 2), {}), ((3, 4), {})])
    finally:
        task_enqueued.disconnect(enqueued)
    assert seen == [one.id, *(r.id for r in many)]
