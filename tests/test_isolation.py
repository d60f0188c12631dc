"""Issue 8, isolation: nothing one job returns, raises or asks for stops a worker.

Each poisoned job ends as its own failure (or capped, for a delay too long),
every other job completes exactly once, and a `--burst` worker exits 0.
Real worker processes against the real database.
"""

import datetime as dt
import subprocess
import sys

import pytest
from django.db import connection
from django.utils import timezone

from django_conveyor import protocol
from django_conveyor.backend import ConveyorBackend
from django_conveyor.bounds import MAX_SECONDS
from django_conveyor.models import Job
from django_conveyor.serialization import REPLACED_NOTE
from django_conveyor.worker import attempts, outcomes
from tests import unchecked
from tests.helpers import REPO, run_burst, worker_env
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED_SNOOZE = "asks for no delay PostgreSQL can store"
CAPPED = "is longer than the maximum of 315360000 seconds (ten years)"


def burst(tmp_path, *args, env=None):
    """A real `conveyor_worker --burst --concurrency 2`; returns (exit code, its log)."""
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "django", "conveyor_worker", "-v", "2", "--burst",
             "--concurrency", "2", "--queues", "default", *args],
            cwd=REPO, env={**worker_env(), **(env or {})}, stdout=out,
            stderr=subprocess.STDOUT, timeout=120,
        )  # fmt: skip
    return proc.returncode, log.read_text()


def enqueue_past_validation(task_path, max_attempts=1):
    """A job of a task whose options escaped validation (enqueue would refuse the task)."""
    job = protocol.NewJob(task_path, [], {}, "default", "default", 0, max_attempts)
    with connection.cursor() as cursor:
        [row] = protocol.enqueue(cursor, [job], notify=False)
    return row


def ordinary(n=4):
    return [tasks.add.enqueue(i, 1) for i in range(n)]


def assert_completed_once(results):
    for i, result in enumerate(results):
        row = Job.objects.get(pk=result.id)
        assert (row.state, row.attempt, row.return_value, row.errors) == ("completed", 1, i + 1, [])


def last_error(result):
    return Job.objects.get(pk=result.id).errors[-1]


def test_every_poison_is_its_own_jobs_failure_and_the_burst_exits_zero(tmp_path):
    before = ordinary()
    poisoned = {kind: tasks.poison.enqueue(kind) for kind in tasks.POISONS}
    poisoned["nul_exception"] = tasks.poison.using(max_attempts=1).enqueue("nul_exception")
    backoff = enqueue_past_validation("tests.testapp.tasks.huge_backoff")
    after = ordinary()
    started = timezone.now()

    code, log = burst(tmp_path)

    assert code == 0, log
    assert "control loop error" not in log
    assert "writing them one by one" not in log  # Every poison was caught before SQL.
    assert_completed_once(before)
    assert_completed_once(after)
    states = {kind: Job.objects.get(pk=r.id).state for kind, r in poisoned.items()}
    assert states == {
        **dict.fromkeys(tasks.POISONS, "failed"),
        "nul_exception": "dead",  # An exception is retried; its text was made storable.
        "huge_snooze": "available",  # Capped: it waits ten years, not 53,900.
    }
    error = last_error(poisoned["nul_return"])
    assert error["exception_class_path"] == "django_conveyor.exceptions.ArgumentsNotSerializable"
    assert (
        "poison() return value contains a NUL character (\\x00), which PostgreSQL cannot store."
        in error["traceback"]
    )
    for kind in ("nul_discard", "nul_exception"):
        assert "bad byte \\x00" in last_error(poisoned[kind])["traceback"]
        assert last_error(poisoned[kind])["traceback"].endswith(REPLACED_NOTE)
    for kind, shown in [("nan_snooze", "nan"), ("inf_snooze", "inf"), ("negative_snooze", "-1.0")]:
        error = last_error(poisoned[kind])
        assert error["exception_class_path"] == "django_conveyor.exceptions.Snooze"
        assert f"Snooze({shown}) {REFUSED_SNOOZE}" in error["traceback"]
    assert "poison() return value is nan" in last_error(poisoned["nan_return"])["traceback"]
    assert "nests more than 100 levels" in last_error(poisoned["deep_return"])["traceback"]

    snoozed = Job.objects.get(pk=poisoned["huge_snooze"].id)
    assert (snoozed.attempt, snoozed.errors) == (0, [])
    ten_years = started + dt.timedelta(seconds=MAX_SECONDS)
    assert ten_years <= snoozed.run_after <= ten_years + dt.timedelta(minutes=5)
    [note] = snoozed.history
    assert note["action"] == "snooze_capped"
    assert note["actor"].startswith("worker:")
    assert f"1.7e+12 seconds, {CAPPED}" in note["detail"]

    dead = Job.objects.get(pk=backoff.id)
    assert (dead.state, dead.attempt) == ("dead", 1)
    assert ten_years <= dead.run_after <= ten_years + dt.timedelta(minutes=5)
    assert CAPPED in dead.errors[0]["traceback"]
    # Every stored time is one Python reads back (the admin and get_result() did not).
    for job in Job.objects.all():
        ConveyorBackend.get_result(tasks.add.get_backend(), str(job.id))


def test_a_row_postgresql_refuses_fails_alone_and_the_rest_of_the_batch_is_written(tmp_path):
    """The checks before SQL turned off (tests/unchecked.py): PostgreSQL refuses the rows."""
    before = ordinary()
    refused = [tasks.unchecked_poison.enqueue(kind) for kind in ("nul_return", "nul_exception")]
    after = ordinary()

    code, log = burst(tmp_path, env={"CONVEYOR_TEST_UNCHECKED": "1"})

    assert code == 0, log
    assert "writing them one by one" in log
    assert "control loop error" not in log
    assert_completed_once(before)
    assert_completed_once(after)
    for result, kind in zip(refused, ("complete", "retry"), strict=True):
        row = Job.objects.get(pk=result.id)
        assert (row.state, row.attempt, len(row.errors)) == ("failed", 1, 1)
        error = row.errors[0]
        assert error["exception_class_path"] == "django_conveyor.exceptions.OutcomeRefused"
        assert (
            f"PostgreSQL refused to store this attempt's {kind} outcome: "
            "UntranslatableCharacter: unsupported Unicode escape sequence (SQLSTATE 22P05). "
            "The job failed instead, so that the other outcomes of its batch were written."
        ) in error["traceback"]
    assert "unchecked: bad byte \\x00" in Job.objects.get(pk=refused[1].id).errors[0]["traceback"]


def test_a_failure_postgresql_refuses_too_is_left_to_its_lease(monkeypatch):
    unchecked.install_for(monkeypatch)
    poisoned = tasks.unchecked_poison.enqueue("nul_return")
    fine = tasks.add.enqueue(1, 1)

    def unstorable_failure(outcome, refusal):
        return attempts.Outcome(attempts.FAIL, outcome.attempt, error={"traceback": "\x00"})

    monkeypatch.setattr(outcomes, "refused_outcome", unstorable_failure)
    worker = run_burst()

    # Not written, not held: its lease expires and the reaper takes the job back.
    row = Job.objects.get(pk=poisoned.id)
    assert (row.state, row.lease_owner) == ("running", worker.worker_id)
    assert poisoned.id not in worker.holdings.held
    assert worker.counters.counts["outcomes_refused"] == 1
    assert Job.objects.get(pk=fine.id).state == "completed"
