"""What handlers can do, run by an in-process worker against the real database."""

import threading
import time

import pytest

from django_conveyor import operations
from django_conveyor.models import Job, LedgerEntry
from tests.helpers import run_burst, wait_until
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def job(result) -> Job:
    return Job.objects.get(pk=result.id)


def test_retries_with_backoff_end_dead_with_every_error_recorded():
    result = tasks.always_fails.enqueue("boom")
    for _ in range(10):  # backoff is short in the test settings; keep working until final
        run_burst()
        if job(result).state == "dead":
            break
        time.sleep(0.1)
    row = job(result)
    assert row.state == "dead"
    assert row.attempt == 3
    assert [e["attempt"] for e in row.errors] == [1, 2, 3]
    assert all(e["exception_class_path"] == "builtins.ValueError" for e in row.errors)
    assert all("ValueError: boom" in e["traceback"] for e in row.errors)
    assert len({e["token"] for e in row.errors}) == 3  # each attempt had its own token
    result.refresh()
    assert result.status == "FAILED"
    assert result.attempts == 3


def test_backoff_delays_the_retry():
    result = tasks.fails_slowly.enqueue()
    run_burst()
    row = job(result)
    assert row.state == "available"
    assert row.attempt == 1
    assert row.run_after > row.enqueued_at


def test_eventual_success_after_failures():
    result = tasks.fails_then_succeeds.enqueue(2)
    wait_for_final(result)
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 3
    assert len(result.errors) == 2
    assert result.attempts == 3


def wait_for_final(result, rounds=20):
    for _ in range(rounds):
        run_burst()
        if job(result).state in ("completed", "failed", "dead", "cancelled"):
            return
        time.sleep(0.1)
    raise AssertionError(f"job {result.id} never finished: {job(result).state}")


def test_discard_fails_at_once():
    result = tasks.discard_me.enqueue("bad address")
    run_burst()
    row = job(result)
    assert row.state == "failed"
    assert row.attempt == 1
    assert row.errors[0]["exception_class_path"] == "django_conveyor.exceptions.Discard"
    assert "bad address" in row.errors[0]["traceback"]


def test_snooze_runs_later_without_using_an_attempt():
    result = tasks.snooze_once.enqueue(0.2)
    run_burst()
    row = job(result)
    assert row.state == "available"
    assert row.attempt == 0
    assert row.errors == []
    time.sleep(0.3)
    run_burst()
    row = job(result)
    assert row.state == "completed"
    assert row.return_value == 1  # the snoozed run did not count


def test_atomic_effect_is_recorded_once_with_the_token():
    result = tasks.apply_once.enqueue("charge")
    run_burst()
    row = job(result)
    assert row.state == "completed"
    assert row.return_value == {"attempt": 1, "token": row.lease_version}
    effect = Effect.objects.get(label="charge")
    assert (effect.job_id, effect.token) == (row.id, row.lease_version)
    entry = LedgerEntry.objects.get(job=row)
    assert (entry.effect_key, entry.lease_version, entry.worker) == (
        "charge",
        row.lease_version,
        row.lease_owner,
    )


def test_unserializable_return_value_fails_the_job():
    result = tasks.returns_unserializable.enqueue()
    run_burst()
    row = job(result)
    assert row.state == "failed"
    assert (
        row.errors[0]["exception_class_path"]
        == "django_conveyor.exceptions.ArgumentsNotSerializable"
    )


def test_a_handler_calling_sys_exit_does_not_kill_the_slot():
    bad = tasks.exits.enqueue()
    good = tasks.add.enqueue(1, 1)
    run_burst(concurrency=1)
    assert job(bad).state in ("available", "dead")
    assert job(bad).errors[0]["exception_class_path"] == "builtins.SystemExit"
    assert job(good).state == "completed"


def test_timeout_retries_under_the_fence_and_frees_nothing_early():
    result = tasks.too_slow.enqueue(1.0)
    worker = run_burst()
    row = job(result)
    assert row.state == "dead"  # max_attempts=1
    assert row.errors[0]["exception_class_path"] == "builtins.TimeoutError"
    assert worker.counters.counts["timed_out"] == 1
    assert worker.counters.counts["completed"] == 0


def test_paused_queue_is_not_claimed_until_resumed():
    result = tasks.send_email.enqueue("x@example.com")
    operations.pause(["emails"])
    worker = run_burst()
    assert worker.counters.counts["claimed"] == 0
    assert job(result).state == "available"
    operations.resume(["emails"])
    run_burst()
    assert job(result).state == "completed"


def test_requeue_of_dead_job_gets_fresh_attempts():
    result = tasks.discard_me.enqueue("x")
    run_burst()
    assert operations.requeue([int(result.id)]) == [int(result.id)]
    row = job(result)
    assert (row.state, row.attempt) == ("available", 0)
    assert operations.requeue([int(result.id)]) == []  # not failed any more


def test_cancel_only_before_start():
    waiting = tasks.add.enqueue(1, 1)
    done = tasks.add.enqueue(1, 1)
    Job.objects.filter(pk=done.id).update(state="completed")
    assert operations.cancel([int(waiting.id), int(done.id)]) == [int(waiting.id)]
    assert job(waiting).state == "cancelled"
    assert job(done).state == "completed"
    waiting.refresh()
    assert waiting.status == "FAILED"


def test_lease_lost_is_told_to_the_handler_and_its_outcome_is_not_written():
    """A job taken back from under a running handler: the handler learns it."""
    from django_conveyor.worker.config import WorkerOptions
    from django_conveyor.worker.loop import Worker

    result = tasks.sleeper.enqueue(10)
    worker = Worker(
        WorkerOptions(queues=("default",), listen=False, burst=True, concurrency=1, stop_signals=())
    )
    worker.heartbeat.interval = 0.1
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_until(lambda: job(result).state == "running")
    operations.pause(["default"])  # so the worker cannot simply claim it again
    # Another party takes the job: the reaper after expiry, simulated by the
    # same statement with the lease moved into the past.
    Job.objects.filter(pk=result.id).update(lease_expires_at="2000-01-01T00:00:00Z")
    from django.db import connection

    from django_conveyor import protocol

    with connection.cursor() as cursor:
        reaped = protocol.reap(cursor)
    assert [r.id for r in reaped] == [int(result.id)]
    thread.join(15)
    assert not thread.is_alive()
    assert worker.counters.counts["leases_lost"] == 1
    assert worker.counters.counts["stale_outcomes"] == 1  # the sleeper stopped early
    assert worker.counters.counts["completed"] == 0
    row = job(result)
    assert (row.state, row.attempt) == ("available", 1)
    assert row.errors[0]["exception_class_path"] == "django_conveyor.exceptions.LeaseLost"


def test_record_effect_outside_the_guarded_block_is_refused():
    result = tasks.effect_outside_atomic.enqueue()
    run_burst()
    row = job(result)
    assert row.state == "failed"
    assert "record_effect() must run inside context.atomic()" in row.errors[0]["traceback"]
    assert not LedgerEntry.objects.exists()


def test_context_carries_a_stable_key_per_job():
    first = tasks.report_keys.enqueue()
    second = tasks.report_keys.enqueue()
    run_burst()
    a, b = job(first).return_value, job(second).return_value
    assert a["key"] == f"conveyor-job-{first.id}"
    assert a["effect"] == f"conveyor-job-{first.id}-charge"
    assert a["key"] != b["key"]
    assert a["token"] == job(first).lease_version
