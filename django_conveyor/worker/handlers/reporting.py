"""`task_finished`: sent once an attempt's outcome has committed, never before.

The fence can refuse an outcome (the lease was lost, timed out, handed back,
or cancelled), so a handler's return says nothing yet. Only what the cycle
wrote is reported: a completed attempt as SUCCESSFUL; one that will run
again (a retry, a timeout with attempts left) as READY, what the job is
now, with the attempt's error; one that ended the job (failed, dead,
cancelled) as FAILED with it. A refused
outcome sends nothing (the job's next attempt, or the party that took it,
reports it), nor do a snooze or a hand-back (the job runs again as if the
attempt had not started).

In a worker, `Reporter` sends from a thread of its own, so a slow receiver
never delays the control loop (heartbeats, claims). A FAILED signal is sent
while its exception is being handled, as django.tasks does, so receivers
that read `sys.exc_info()` (Django's own logger) get the traceback; a retry
is sent outside it, so Django logs it as an INFO line, not as an error.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable

from django.db import connections

from ...compat import TaskResultStatus, log_task_finished, task_finished
from ...results import finished
from ...signals import heard
from ...tasks import task_or_none
from .. import attempts
from ..attempts import Outcome
from . import executor

logger = logging.getLogger(__name__)

FINISHED_STATUS = {
    attempts.COMPLETE: TaskResultStatus.SUCCESSFUL,
    attempts.DONE_IN_ATOMIC: TaskResultStatus.SUCCESSFUL,
    attempts.FAIL: TaskResultStatus.FAILED,
    attempts.RETRY: TaskResultStatus.FAILED,
    attempts.CANCEL_HELD: TaskResultStatus.FAILED,
}  # Not RELEASE, SNOOZE: the job runs again as if the attempt had not started.
FLUSH_SECONDS = 5.0  # At exit, how long signals still queued may take to be sent.


def reported_as(outcome: Outcome) -> tuple[TaskResultStatus, int] | None:
    """The status `task_finished` reports for a written outcome, and the level
    django.tasks logs it at; None: no signal for it (never started, or it runs
    again as if it had not: a snooze, a hand-back)."""
    status = FINISHED_STATUS.get(outcome.kind)
    if status is None or outcome.attempt.started_at is None:
        return None
    if outcome.became == "retried":
        status = TaskResultStatus.READY  # It runs again: not a failure (and no traceback).
    return status, logging.ERROR if status == TaskResultStatus.FAILED else logging.INFO


def report(outcome: Outcome) -> None:
    """Send `task_finished` for an outcome that was written; call it after the commit.

    Only for an attempt a slot started, and only when something hears the
    signal (signals.heard): otherwise no result is built at all.
    """
    reported = reported_as(outcome)
    if reported is None:
        return
    status, level = reported
    if not heard(task_finished, log_task_finished, level):
        return
    attempt = outcome.attempt
    started = attempt.result
    if started is None:  # Nobody heard task_started: build it now.
        task = task_or_none(attempt.lease.task_path)
        if task is None:
            return
        started = executor.running_result(task, attempt)
    done = finished(
        started, status=status, return_value=outcome.return_value, error=outcome.error or None
    )
    sender = type(started.task.get_backend())
    if outcome.exception is None or status != TaskResultStatus.FAILED:
        task_finished.send(sender, task_result=done)
        return
    try:
        raise outcome.exception
    except BaseException:
        task_finished.send(sender, task_result=done)


class Reporter:
    """The worker's reporting thread: sends `task_finished` in commit order.

    A cycle's outcomes travel as one batch, so the thread wakes once per
    commit, not once per job; when nothing hears the signal at all (only
    django.tasks' log line, and its logger drops even errors) nothing is
    queued and the thread does not wake.
    """

    def __init__(self) -> None:
        self.written: queue.SimpleQueue[list[Outcome] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.run, name="conveyor-reporter", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, outcomes: Iterable[Outcome]) -> None:
        """The outcomes one commit wrote, in their order; only those something hears."""
        # The levels of reported_as(): ERROR is the highest, INFO the lowest.
        if not heard(task_finished, log_task_finished, logging.ERROR):
            return
        everything = heard(task_finished, log_task_finished, logging.INFO)
        batch = [
            o
            for o in outcomes
            if (reported := reported_as(o)) is not None
            and (everything or reported[1] >= logging.ERROR)
        ]
        if batch:
            self.written.put(batch)

    def stop(self) -> None:
        """Send what is queued (up to FLUSH_SECONDS), then end the thread."""
        self.written.put(None)
        if self.thread.is_alive():
            self.thread.join(FLUSH_SECONDS)

    def run(self) -> None:
        while (batch := self.written.get()) is not None:
            for outcome in batch:
                try:
                    report(outcome)
                except Exception:  # A receiver's error is its own, never the worker's.
                    logger.exception("a task_finished receiver raised")
            executor.connection_hygiene()
        connections.close_all()  # This thread's connections, if receivers opened any.
