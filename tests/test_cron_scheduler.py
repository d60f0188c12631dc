"""The scheduler against PostgreSQL, driven by an explicit clock: run_once(cursor, now)."""

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from django_conveyor import protocol
from django_conveyor.models import Cron, Job
from django_conveyor.periodic import ticks
from django_conveyor.periodic.expressions import Timing
from django_conveyor.periodic.schedules import tick_job
from django_conveyor.worker.connections import connect
from django_conveyor.worker.services.scheduler import SchedulerService
from tests.factories import CronFactory

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def run(now: datetime) -> ticks.Counts:
    with connection.cursor() as cursor:
        return ticks.run_once(cursor, now)


def tick_keys(name: str) -> list[str]:
    prefix = f"cron:{name}:"
    keys = Job.objects.filter(idempotency_key__startswith=prefix)
    return sorted(k.removeprefix(prefix) for k in keys.values_list("idempotency_key", flat=True))


def simulate(start: datetime, end: datetime, *, step: timedelta) -> None:
    """A scheduler that wakes at each next tick, and at least every `step`."""
    now = start
    while now < end:
        counts = run(now)
        wake = counts.next_tick_at + timedelta(milliseconds=300)
        now = min(wake, now + step)


class TestCronEnqueue:
    """The protocol action: one tick's job and the row's advance, in one statement."""

    def enqueue(self, cron, *, expected, tick, next_tick):
        with connection.cursor() as cursor:
            return protocol.cron_enqueue(
                cursor, cron_id=cron.id, name=cron.name, expected=expected, tick=tick,
                next_tick=next_tick, job=tick_job(cron), notify=True,
            )  # fmt: skip

    def test_inserts_the_job_and_advances_the_row(self):
        cron = CronFactory(name="report", created=T0, task_path="tests.testapp.tasks.add",
                           args=[1, 2], queue="emails", priority=7)  # fmt: skip
        tick = cron.next_tick_at
        written = self.enqueue(cron, expected=tick, tick=tick, next_tick=tick + timedelta(60))
        assert written.created
        job = Job.objects.get(pk=written.job_id)
        assert job.idempotency_key == "cron:report:2026-06-01T12:01:00Z"
        assert (job.task_path, job.args, job.queue, job.priority, job.state) == (
            "tests.testapp.tasks.add", [1, 2], "emails", 7, "available"
        )  # fmt: skip
        assert job.run_after == tick
        cron.refresh_from_db()
        assert (cron.last_tick_at, cron.next_tick_at, cron.last_job_id) == (
            tick, tick + timedelta(60), job.id
        )  # fmt: skip

    def test_a_stale_expected_tick_writes_nothing(self):
        cron = CronFactory(created=T0)
        tick = cron.next_tick_at
        assert self.enqueue(cron, expected=tick - timedelta(60), tick=tick, next_tick=None) is None
        assert Job.objects.count() == 0
        cron.refresh_from_db()
        assert cron.last_tick_at is None and cron.next_tick_at == tick

    def test_a_disabled_schedule_writes_nothing(self):
        cron = CronFactory(created=T0, enabled=False)
        tick = cron.next_tick_at
        assert self.enqueue(cron, expected=tick, tick=tick, next_tick=None) is None
        assert Job.objects.count() == 0

    def test_an_existing_tick_job_is_kept_and_linked(self):
        cron = CronFactory(name="dup", created=T0)
        tick = cron.next_tick_at
        first = self.enqueue(cron, expected=tick, tick=tick, next_tick=tick + timedelta(60))
        Cron.objects.filter(pk=cron.pk).update(next_tick_at=tick)  # reset by hand
        again = self.enqueue(cron, expected=tick, tick=tick, next_tick=tick + timedelta(60))
        assert (again.created, again.job_id) == (False, first.job_id)
        assert Job.objects.count() == 1

    def test_a_locked_row_is_skipped_not_waited_for(self):
        cron = CronFactory(created=T0)
        tick = cron.next_tick_at
        other = connect("default")
        try:
            with other.transaction():
                other.execute("SELECT 1 FROM conveyor_cron WHERE id = %s FOR UPDATE", [cron.id])
                assert self.enqueue(cron, expected=tick, tick=tick, next_tick=None) is None
        finally:
            other.close()
        assert Job.objects.count() == 0

    def test_a_rolled_back_tick_is_enqueued_once_by_the_next_pass(self):
        cron = CronFactory(name="restart", created=T0)
        tick = cron.next_tick_at
        with pytest.raises(RuntimeError), transaction.atomic():
            self.enqueue(cron, expected=tick, tick=tick, next_tick=None)
            raise RuntimeError("the worker died before the commit")
        assert Job.objects.count() == 0
        assert run(tick).enqueued == 1
        assert run(tick).enqueued == 0
        assert tick_keys("restart") == ["2026-06-01T12:01:00Z"]


class TestRunOnce:
    def test_nothing_due(self):
        cron = CronFactory(created=T0)
        counts = run(T0 + timedelta(seconds=30))
        assert (counts.due, counts.enqueued, counts.next_tick_at) == (0, 0, cron.next_tick_at)

    def test_each_due_tick_once_and_the_next_tick_reported(self):
        CronFactory(name="every-20s", schedule="*/20 * * * * *", created=T0)
        counts = run(T0 + timedelta(seconds=65))  # three ticks, the oldest 45 s late
        assert (counts.due, counts.enqueued, counts.missed) == (1, 3, 0)
        assert counts.next_tick_at == T0 + timedelta(seconds=80)
        assert run(T0 + timedelta(seconds=66)).enqueued == 0
        assert tick_keys("every-20s") == [
            "2026-06-01T12:00:20Z", "2026-06-01T12:00:40Z", "2026-06-01T12:01:00Z"
        ]  # fmt: skip

    def test_a_late_pass_within_the_grace_period_is_not_a_missed_tick(self):
        CronFactory(name="skipper", schedule="0 * * * *", missed="skip", created=T0)
        counts = run(at("2026-06-01T13:00:45Z"))
        assert (counts.enqueued, counts.missed) == (1, 0)

    def test_disabled_schedules_are_not_due(self):
        CronFactory(created=T0, enabled=False)
        assert run(T0 + timedelta(hours=1)).due == 0

    def test_an_invalid_row_is_stopped_not_retried_every_pass(self):
        cron = CronFactory(created=T0)
        Cron.objects.filter(pk=cron.pk).update(timezone="Mars/Olympus")
        assert run(T0 + timedelta(minutes=2)).stopped == 1
        assert Cron.objects.get(pk=cron.pk).next_tick_at is None
        assert run(T0 + timedelta(minutes=3)).due == 0

    def test_a_full_batch_asks_for_another_pass(self):
        for _ in range(3):
            CronFactory(created=T0)
        with connection.cursor() as cursor:
            counts = ticks.run_once(cursor, T0 + timedelta(minutes=1), limit=2)
        assert (counts.due, counts.more) == (2, True)

    def test_the_job_takes_the_task_defaults_and_the_rows_arguments(self):
        CronFactory(name="nightly", task_path="tests.testapp.tasks.nightly_report",
                    kwargs={"full": True}, queue="emails", created=T0)  # fmt: skip
        run(T0 + timedelta(minutes=1))
        job = Job.objects.get()
        assert (job.kwargs, job.queue, job.max_attempts) == ({"full": True}, "emails", 3)


class TestMissedTicksAfterA3DayOutage:
    """Hourly schedule; its last tick ran at 13:00; no scheduler ran for 3 days."""

    RESUME = at("2026-06-04T13:30:00Z")  # 72 ticks (14:00 .. 13:00) were missed.

    def outage(self, missed: str, schedule: str = "0 * * * *") -> Cron:
        created = at("2026-06-01T12:59:30Z")
        cron = CronFactory(name=f"{missed}", schedule=schedule, missed=missed, created=created)
        run(at("2026-06-01T13:00:05Z"))
        assert len(tick_keys(cron.name)) == 1
        return cron

    def test_latest_runs_the_most_recent_missed_tick_once(self):
        cron = self.outage("latest")
        counts = run(self.RESUME)
        assert (counts.enqueued, counts.missed) == (1, 1)
        assert tick_keys(cron.name) == ["2026-06-01T13:00:00Z", "2026-06-04T13:00:00Z"]
        cron.refresh_from_db()
        assert cron.next_tick_at == at("2026-06-04T14:00:00Z")

    def test_latest_drops_the_missed_ticks_when_a_tick_is_on_time(self):
        cron = self.outage("latest")
        run(at("2026-06-04T13:00:30Z"))  # the 13:00 tick is 30 s late: on time.
        assert tick_keys(cron.name) == ["2026-06-01T13:00:00Z", "2026-06-04T13:00:00Z"]

    def test_all_backfills_every_missed_tick(self):
        cron = self.outage("all")
        assert run(self.RESUME).enqueued == 72
        keys = tick_keys(cron.name)
        assert len(keys) == 73 and len(set(keys)) == 73
        assert keys[1] == "2026-06-01T14:00:00Z" and keys[-1] == "2026-06-04T13:00:00Z"
        assert run(self.RESUME).enqueued == 0

    def test_all_is_capped_to_the_latest_ticks(self):
        cron = self.outage("all", schedule="* * * * *")  # 4,320 minutes, 2 on time.
        assert run(self.RESUME).enqueued == ticks.BACKFILL_LIMIT + 2
        keys = tick_keys(cron.name)
        assert keys[1] == "2026-06-04T11:49:00Z"  # the latest 100 missed ones...
        assert keys[-3:] == [f"2026-06-04T13:{m}:00Z" for m in (28, 29, 30)]  # ...and on time

    def test_skip_runs_nothing_and_resumes_on_time(self):
        cron = self.outage("skip")
        counts = run(self.RESUME)
        assert (counts.enqueued, counts.missed) == (0, 1)
        cron.refresh_from_db()
        assert cron.next_tick_at == at("2026-06-04T14:00:00Z")
        run(at("2026-06-04T14:00:01Z"))
        assert tick_keys(cron.name) == ["2026-06-01T13:00:00Z", "2026-06-04T14:00:00Z"]

    def test_a_disabled_schedule_enabled_again_uses_its_policy(self):
        cron = self.outage("latest")
        Cron.objects.filter(pk=cron.pk).update(enabled=False)
        assert run(self.RESUME).due == 0
        Cron.objects.filter(pk=cron.pk).update(enabled=True)
        assert run(self.RESUME).enqueued == 1


@pytest.mark.parametrize(
    ("zone", "start", "expected"),
    [
        # Spring forward: 02:00-03:00 does not exist; both run once at 03:00.
        (
            "Europe/Berlin",
            "2026-03-27T12:00Z",
            {
                "0 2 * * *": ["03-28T01:00", "03-29T01:00", "03-30T00:00", "03-31T00:00"],
                "30 2 * * *": ["03-28T01:30", "03-29T01:00", "03-30T00:30", "03-31T00:30"],
            },
        ),
        # Fall back: 02:00-03:00 happens twice; both run once, at the first.
        (
            "Europe/Berlin",
            "2026-10-23T12:00Z",
            {
                "0 2 * * *": ["10-24T00:00", "10-25T00:00", "10-26T01:00", "10-27T01:00"],
                "30 2 * * *": ["10-24T00:30", "10-25T00:30", "10-26T01:30", "10-27T01:30"],
            },
        ),
        (
            "America/New_York",
            "2026-03-06T12:00Z",
            {
                "0 2 * * *": ["03-07T07:00", "03-08T07:00", "03-09T06:00", "03-10T06:00"],
                "30 2 * * *": ["03-07T07:30", "03-08T07:00", "03-09T06:30", "03-10T06:30"],
            },
        ),
        (
            "America/New_York",
            "2026-10-30T12:00Z",
            {
                "0 2 * * *": ["10-31T06:00", "11-01T07:00", "11-02T07:00", "11-03T07:00"],
                "30 2 * * *": ["10-31T06:30", "11-01T07:30", "11-02T07:30", "11-03T07:30"],
            },
        ),
    ],
)
def test_dst_transitions_run_each_daily_time_exactly_once(zone, start, expected):
    begin = at(start)
    for expression in expected:
        CronFactory(name=expression.replace(" ", "_").replace("*", "x"), schedule=expression,
                    timezone=zone, created=begin)  # fmt: skip
    # Passes every 5 minutes, and at each tick, for four days across the change.
    simulate(begin, begin + timedelta(days=4), step=timedelta(minutes=5))
    for expression, instants in expected.items():
        name = expression.replace(" ", "_").replace("*", "x")
        assert tick_keys(name) == [f"2026-{t}:00Z" for t in instants], expression


def test_two_schedulers_racing_the_same_passes_write_one_job_per_tick():
    for n in range(20):
        CronFactory(name=f"race-{n}", schedule="* * * * * *", created=T0)  # every second
    instants = [T0 + timedelta(seconds=s, milliseconds=500) for s in range(1, 31)]
    barrier = threading.Barrier(2)
    totals: list[ticks.Counts] = []

    def scheduler_thread():
        conn = connect("default")
        try:
            for now in instants:
                barrier.wait()
                with conn.cursor() as cursor:
                    totals.append(ticks.run_once(cursor, now))
        finally:
            conn.close()

    threads = [threading.Thread(target=scheduler_thread) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(totals) == 60
    assert sum(c.enqueued for c in totals) == 20 * 30
    assert Job.objects.count() == 20 * 30
    for n in range(20):
        keys = tick_keys(f"race-{n}")
        assert keys == [f"2026-06-01T12:00:{s:02d}Z" for s in range(1, 31)]


def test_the_service_sleeps_until_the_next_tick_or_one_interval():
    service = SchedulerService()
    with connection.cursor() as cursor:
        db_now = ticks.database_now(cursor)
        CronFactory(schedule="0 0 1 1 *", created=db_now)  # next year
        service.run_once(cursor)
        assert service.interval - 0.1 < service.seconds_until_due(time.monotonic()) <= 1.0
        soon = CronFactory(schedule="0 0 1 1 *", created=db_now)
        Cron.objects.filter(pk=soon.pk).update(next_tick_at=db_now + timedelta(seconds=30.2))
        service.run_once(cursor)  # a pass well before the tick...
        Cron.objects.filter(pk=soon.pk).update(
            next_tick_at=ticks.database_now(cursor) + timedelta(milliseconds=200)
        )
        service.run_once(cursor)  # ...and one 0.2 s before it: it wakes for the tick.
        assert service.seconds_until_due(time.monotonic()) < 0.25


def test_forward_and_backward_ticks_agree_across_dst():
    for zone in ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe"):
        for expression in (
            "0 2 * * *",
            "30 2 * * *",
            "*/30 2 * * *",
            "0 */2 * * *",
            "*/20 * * * *",
        ):
            timing = Timing(expression, zone)
            begin, end = at("2026-03-01T00:00Z"), at("2026-11-30T00:00Z")
            forward = []
            for tick in timing.ticks_after(begin - timedelta(microseconds=1)):
                if tick >= end:
                    break
                forward.append(tick)
            assert forward == timing.between(begin, end, limit=100_000), (zone, expression)


def test_a_tick_postgresql_refuses_stops_its_schedule_not_the_pass(monkeypatch):
    bad = CronFactory(name="bad", created=T0)
    good = CronFactory(name="good", task_path="tests.testapp.tasks.nightly_report", created=T0)

    def refused_for_bad(row):  # A job conveyor_job's CHECK refuses: max_attempts 0.
        job = tick_job(row)
        return dataclasses.replace(job, max_attempts=0) if row.name == "bad" else job

    monkeypatch.setattr(ticks, "tick_job", refused_for_bad)
    conn = connect("default")  # autocommit, as in a worker
    try:
        with conn.cursor() as cursor:
            counts = ticks.run_once(cursor, T0 + timedelta(minutes=1))
    finally:
        conn.close()
    assert (counts.enqueued, counts.stopped) == (1, 1)
    assert tick_keys("good") == ["2026-06-01T12:01:00Z"] and tick_keys("bad") == []
    assert Cron.objects.get(pk=bad.pk).next_tick_at is None
    assert Cron.objects.get(pk=good.pk).next_tick_at == T0 + timedelta(minutes=2)
