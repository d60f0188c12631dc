"""The worker sends django.tasks' signals whenever anything can observe them.

It skips building an attempt's TaskResult only when the sole receivers are
django.tasks' own log lines and their level is off (what a fast deployment
configures); any receiver, or the log level on, brings everything back.
"""

import logging

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
