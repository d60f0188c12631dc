"""Each maintenance service's run_once on its own, against the real database.

The heartbeat, the reaper and the timeouts are driven directly with an
explicit clock; the assertions are on the counts they return and on rows.
Then the schedule that runs them, and the one outcome path they feed.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

import psycopg
import pytest
from django.utils import timezone

from django_conveyor import protocol
from django_conveyor.models import Dependency, Job
from django_conveyor.worker import attempts, claims
from django_conveyor.worker.attempts import Attempt, Outcome
from django_conveyor.worker.claims import Claimer
from django_conveyor.worker.connections import connect
from django_conveyor.worker.holdings import Holdings
from django_conveyor.worker.instrument import Counters, Instrument
from django_conveyor.worker.services.base import Now, Timetable
from django_conveyor.worker.services.heartbeat import Heartbeat, HeartbeatCounts, interval_for
from django_conveyor.worker.services.reaper import ReapCounts, Reaper
from django_conveyor.worker.services.timeouts import TimeoutCounts, Timeouts
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-t"
T = 1000.0  # A monotonic instant.
T0 = Now(monotonic=1000.0, utc=dt.datetime(2026, 3, 29, 1, 0, tzinfo=dt.UTC))


@dataclass
class Recorder(Instrument):
    """An instrument that keeps every event it is told."""

    events: list[tuple] = field(default_factory=list)

    def claimed(self, leases):
        self.events.append(("claimed", [lease.id for lease in leases]))

    def outcome_written(self, kind, result, lease, duration):
        self.events.append(("written", kind, result, lease.id, duration))

    def outcome_refused(self, kind, lease):
        self.events.append(("refused", kind, lease.id))

    def lease_lost(self, lease, reason):
        self.events.append(("lost", lease.id, reason))


@pytest.fixture
def conn():
    with connect("default") as connection:
        yield connection


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def holdings(recorder):
    return Holdings(OWNER, "default", Counters(), recorder)


def claim(conn, holdings, n=10) -> list[Attempt]:
    with conn.cursor() as cur:
        claimed = protocol.claim(cur, owner=OWNER, queues=["default"], limit=n, lease_seconds=30)
    return holdings.take(claimed)


def row(held: Attempt) -> Job:
    return Job.objects.get(pk=held.lease.id)


def cycle(conn, holdings) -> None:
    """What the worker's cycle does with the outcomes (without claiming)."""
    holdings.collect()
    batch = holdings.take_pending()
    with conn.transaction(), conn.cursor() as cur:
        written = holdings.write(cur, batch)
    holdings.settle(batch, written)


class TestHeartbeat:
    def test_renews_every_held_lease_and_counts_them(self, conn, holdings):
        JobFactory.create_batch(3)
        held = claim(conn, holdings)
        Job.objects.update(lease_expires_at=timezone.now() + dt.timedelta(seconds=5))
        beat = Heartbeat(holdings, lease_seconds=120)
        with conn.cursor() as cur:
            assert beat.run_once(cur, T0) == HeartbeatCounts(renewed=3, leases_lost=0)
        soon = timezone.now() + dt.timedelta(seconds=100)
        assert all(row(h).lease_expires_at > soon for h in held)
        assert set(holdings.held) == {h.lease.id for h in held}

    def test_a_lease_taken_by_another_token_is_lost_and_told(self, conn, holdings, recorder):
        JobFactory.create_batch(2)
        mine, taken = claim(conn, holdings)
        Job.objects.filter(pk=taken.lease.id).update(lease_version=99, lease_owner="worker-z")
        with conn.cursor() as cur:
            counts = Heartbeat(holdings, lease_seconds=30).run_once(cur, T0)
        assert counts == HeartbeatCounts(renewed=1, leases_lost=1)
        assert set(holdings.held) == {mine.lease.id}
        assert taken.lost and not mine.lost
        assert recorder.events[-1] == ("lost", taken.lease.id, "heartbeat found the lease gone")

    def test_a_job_in_its_guarded_block_is_not_lost(self, conn, holdings):
        JobFactory()
        [held] = claim(conn, holdings)
        held.in_atomic = True
        with connect("default") as other, other.transaction():  # The handler's row lock.
            other.execute("SELECT 1 FROM conveyor_job WHERE id = %s FOR UPDATE", [held.lease.id])
            with conn.cursor() as cur:
                counts = Heartbeat(holdings, lease_seconds=30).run_once(cur, T0)
        assert counts == HeartbeatCounts(renewed=0, leases_lost=0)
        assert holdings.held == {held.lease.id: held}

    def test_a_row_another_claim_has_locked_is_not_lost(self, conn, holdings, recorder):
        """A concurrent CLAIM keeps its lock on a row it rejected until it commits."""
        JobFactory.create_batch(2)
        locked, free = claim(conn, holdings)
        with connect("default") as other, other.transaction():
            other.execute("SELECT 1 FROM conveyor_job WHERE id = %s FOR UPDATE", [locked.lease.id])
            with conn.cursor() as cur:
                counts = Heartbeat(holdings, lease_seconds=30).run_once(cur, T0)
        assert counts == HeartbeatCounts(renewed=1, leases_lost=0)
        assert set(holdings.held) == {locked.lease.id, free.lease.id}
        assert not locked.lost and not any(e[0] == "lost" for e in recorder.events)
        holdings.report(Outcome(attempts.COMPLETE, locked, return_value="done"))
        cycle(conn, holdings)
        assert (row(locked).state, row(locked).return_value) == ("completed", "done")

    def test_nothing_held_sends_nothing(self, holdings):
        assert Heartbeat(holdings, lease_seconds=30).run_once(None, T0) == HeartbeatCounts()

    def test_beats_at_most_every_third_of_the_lease(self):
        assert interval_for(30.0, 10.0) == 10.0
        assert interval_for(6.0, 10.0) == 2.0


class TestReaper:
    def test_takes_back_expired_leases_and_counts_the_dead(self, conn):
        alive = JobFactory(running=True)
        expired = JobFactory.create_batch(2, expired=True, max_attempts=3)
        used_up = JobFactory(expired=True, attempt=3, max_attempts=3)
        with conn.cursor() as cur:
            assert Reaper().run_once(cur, T0) == ReapCounts(reaped=3, reaped_dead=1)
        states = dict(Job.objects.values_list("id", "state"))
        assert states == {
            alive.id: "running",
            expired[0].id: "available",
            expired[1].id: "available",
            used_up.id: "dead",
        }

    def test_one_pass_drains_batch_after_batch_until_one_comes_back_short(self, conn, monkeypatch):
        JobFactory.create_batch(5, expired=True)
        taken = []  # Rows each REAP statement took back.
        reap = protocol.reap
        monkeypatch.setattr(
            protocol, "reap", lambda *a, **kw: taken.append(reap(*a, **kw)) or taken[-1]
        )
        reaper = Reaper(batch=2)
        with conn.cursor() as cur:
            assert reaper.run_once(cur, T0) == ReapCounts(reaped=5)
            assert [len(rows) for rows in taken] == [2, 2, 1]  # One pass, three statements.
            assert reaper.run_once(cur, T0) == ReapCounts()
        assert set(Job.objects.values_list("state", flat=True)) == {"available"}

    def test_a_full_batch_ends_the_pass_after_max_batches(self, conn):
        JobFactory.create_batch(5, expired=True)
        reaper = Reaper(batch=2, max_batches=2)
        with conn.cursor() as cur:
            assert reaper.run_once(cur, T0) == ReapCounts(reaped=4)
            assert Job.objects.filter(state="running").count() == 1  # The next pass's.
            assert reaper.run_once(cur, T0) == ReapCounts(reaped=1)

    def test_counts_the_jobs_it_cancels(self, conn):
        asked = JobFactory(
            expired=True, cancel_requested_at=timezone.now(), cancel_requested_by="ops"
        )
        JobFactory(expired=True)
        with conn.cursor() as cur:
            assert Reaper().run_once(cur, T0) == ReapCounts(reaped=2, reaped_cancelled=1)
        assert Job.objects.get(pk=asked.pk).state == "cancelled"

    def test_a_dead_jobs_dependents_are_settled_in_the_reaps_transaction(self, conn):
        used_up = JobFactory(expired=True, attempt=3, max_attempts=3)
        dependent = JobFactory(state="blocked", pending_dependencies=1, dependency_policy="cancel")
        Dependency.objects.create(job=dependent, depends_on=used_up)
        refuse = """CREATE FUNCTION refuse_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused: %', NEW.id; END $$;
            CREATE TRIGGER refuse_cancel BEFORE UPDATE ON conveyor_job FOR EACH ROW
            WHEN (NEW.state = 'cancelled') EXECUTE FUNCTION refuse_cancel()"""
        conn.execute(refuse)  # The settling of the dependents fails ...
        try:
            with conn.cursor() as cur, pytest.raises(psycopg.errors.RaiseException):
                Reaper().run_once(cur, T0)
        finally:
            conn.execute(
                "DROP TRIGGER refuse_cancel ON conveyor_job; DROP FUNCTION refuse_cancel()"
            )
        # ... so the REAP before it is not written either: nothing half-done.
        assert Job.objects.get(pk=used_up.pk).state == "running"
        assert Job.objects.get(pk=dependent.pk).state == "blocked"
        with conn.cursor() as cur:
            assert Reaper().run_once(cur, T0) == ReapCounts(reaped=1, reaped_dead=1)
        assert Job.objects.get(pk=used_up.pk).state == "dead"
        assert Job.objects.get(pk=dependent.pk).state == "cancelled"

    def test_logs_each_job_it_takes_back(self, conn, caplog):
        job = JobFactory(expired=True)
        with caplog.at_level(logging.WARNING), conn.cursor() as cur:
            Reaper().run_once(cur, T0)
        assert f"job={job.id} " in caplog.text
        assert "reaped from worker worker-a: lease expired -> available" in caplog.text


class TestTimeouts:
    def started(self, held: Attempt, at: float, timeout: float | None) -> None:
        held.started_at, held.timeout = at, timeout

    def test_an_attempt_past_its_timeout_becomes_a_retry_outcome(self, conn, holdings):
        JobFactory.create_batch(4, max_attempts=3)
        late, on_time, no_timeout, _buffered = claim(conn, holdings)
        self.started(late, T0.monotonic - 5.0, 2.0)
        self.started(on_time, T0.monotonic - 1.0, 2.0)
        self.started(no_timeout, T0.monotonic - 500.0, None)
        assert Timeouts(holdings).run_once(None, T0) == TimeoutCounts(timed_out=1)
        assert late.lost and late.lost_reason == "timed out after 2s"
        assert late.lease.id not in holdings.held
        [outcome] = holdings.pending.values()
        assert (outcome.kind, outcome.attempt) == (attempts.RETRY, late)
        assert outcome.error["exception_class_path"] == "builtins.TimeoutError"
        assert row(late).state == "running"  # Nothing written yet: that is the cycle's job.
        cycle(conn, holdings)
        after = row(late)
        assert (after.state, after.attempt, after.lease_owner) == ("available", 1, None)
        assert after.errors[0]["exception_class_path"] == "builtins.TimeoutError"
        assert "past its timeout of 2 seconds" in after.errors[0]["traceback"]
        assert holdings.counters.counts["retried"] == 1

    def test_the_last_attempt_timing_out_is_dead(self, conn, holdings):
        JobFactory(max_attempts=1)
        [held] = claim(conn, holdings)
        self.started(held, T0.monotonic - 3.0, 1.0)
        assert Timeouts(holdings).run_once(None, T0) == TimeoutCounts(timed_out=1)
        cycle(conn, holdings)
        assert row(held).state == "dead"
        assert holdings.counters.counts["dead"] == 1

    def test_an_attempt_in_its_guarded_block_or_finished_is_left_alone(self, conn, holdings):
        JobFactory.create_batch(3)
        in_block, committed, returned = claim(conn, holdings)
        for held in (in_block, committed, returned):
            self.started(held, T0.monotonic - 10.0, 1.0)
        in_block.in_atomic = True
        committed.completed_in_atomic = True
        returned.finished_at = T0.monotonic - 0.5  # Its outcome is on its way.
        assert Timeouts(holdings).run_once(None, T0) == TimeoutCounts(timed_out=0)
        assert holdings.pending == {}

    def test_the_handlers_own_late_outcome_is_stale(self, conn, holdings, recorder):
        JobFactory()
        [held] = claim(conn, holdings)
        self.started(held, T0.monotonic - 3.0, 1.0)
        Timeouts(holdings).run_once(None, T0)
        holdings.report(Outcome(attempts.COMPLETE, held, return_value=1))
        cycle(conn, holdings)
        assert row(held).state == "available"
        assert ("refused", attempts.COMPLETE, held.lease.id) in recorder.events
        assert holdings.counters.counts["stale_outcomes"] == 1


class TestOutcomePath:
    def test_each_kind_is_written_once_fenced_and_reported(self, conn, holdings, recorder):
        JobFactory.create_batch(5)
        done, failed, snoozed, handed_back, stale = claim(conn, holdings)
        Job.objects.filter(pk=stale.lease.id).update(lease_version=50)
        for held in (done, failed, snoozed, stale):
            held.started_at, held.finished_at = 10.0, 10.25
        holdings.report(Outcome(attempts.COMPLETE, done, return_value={"ok": 1}))
        holdings.report(Outcome(attempts.FAIL, failed, error={"exception_class_path": "x.Y"}))
        holdings.report(Outcome(attempts.SNOOZE, snoozed, delay=60))
        holdings.report(Outcome(attempts.COMPLETE, stale, return_value=2))
        holdings.collect()
        assert holdings.give_up(handed_back, Outcome(attempts.RELEASE, handed_back), "test")
        assert not holdings.give_up(done, Outcome(attempts.RELEASE, done), "test")  # Has one.
        cycle(conn, holdings)
        states = {h.lease.id: row(h).state for h in (done, failed, snoozed, handed_back, stale)}
        assert list(states.values()) == ["completed", "failed", "available", "available", "running"]
        assert row(handed_back).attempt == 0  # A hand-back gives the attempt back.
        assert dict(holdings.counters.counts) == {
            "claimed": 5,
            "completed": 1,
            "failed": 1,
            "snoozed": 1,
            "released": 1,
            "stale_outcomes": 1,
        }
        written = [e for e in recorder.events if e[0] == "written"]
        assert ("written", attempts.COMPLETE, "completed", done.lease.id, 0.25) in written
        assert ("written", attempts.RELEASE, "released", handed_back.lease.id, None) in written
        assert ("refused", attempts.COMPLETE, stale.lease.id) in recorder.events
        assert holdings.idle()

    def test_the_lease_carries_the_token_from_the_claim(self, conn, holdings):
        job = JobFactory(lease_version=4)
        [held] = claim(conn, holdings)
        assert (held.lease.owner, held.lease.version) == (OWNER, 5)
        assert held.lease.errors is None  # A first attempt: nothing before it.
        assert 0 <= held.lease.pickup_delay < 60
        assert held.lease.id == job.id


class TestClaimer:
    def claimer(self, prefetch=None):
        return Claimer(
            owner=OWNER, queues=["default"], concurrency=4, lease_seconds=30, prefetch=prefetch
        )

    def test_the_buffer_adapts_to_job_length(self):
        claimer = self.claimer()
        assert claimer.prefetch(None) == 4  # Nothing has run yet: the concurrency.
        assert claimer.prefetch(0.001) == 400  # 100 ms of work per slot.
        assert claimer.prefetch(1e-9) == 1024  # Capped.
        assert claimer.prefetch(5.0) == 0  # Long jobs are not hoarded.
        # What the slots' queue holds, listed as may-start: the part a crash implicates.
        # The adaptive buffer fits in it; only a fixed deeper one keeps a reserve.
        assert claimer.start_window(0.01) == 40
        assert claimer.start_window(0.001) == 400
        assert claimer.start_window(1e-9) == 1024
        assert self.claimer(prefetch=4000).start_window(None) == 1024
        assert self.claimer(prefetch=2).start_window(None) == 2

    def test_a_fixed_buffer_and_the_room_left(self):
        claimer = self.claimer(prefetch=2)
        assert claimer.room(running=1, waiting=0, avg_duration=0.001) == 5
        assert claimer.room(running=4, waiting=2, avg_duration=0.001) == 0
        assert claimer.plan(running=4, waiting=2, avg_duration=0.001, now=T) == []
        claimer.isolated_due = T + 1  # Not due: CLAIM, then CLAIM_ISOLATED if it found nothing.
        claim, isolated = claimer.plan(running=0, waiting=0, avg_duration=None, now=T)
        assert (claim.statement, claim.limit) == (protocol.claim, 6)
        assert (isolated.statement, isolated.limit, isolated.if_none_claimed) == (
            protocol.claim_isolated,
            1,
            True,
        )

    def test_isolated_jobs_run_without_claim_ahead(self):
        claimer = self.claimer(prefetch=2)
        # Due: CLAIM_ISOLATED first; if it takes one, CLAIM fills only the free slots.
        isolated, claim = claimer.plan(running=1, waiting=0, avg_duration=0.001, now=T)
        assert (isolated.statement, isolated.if_none_claimed) == (protocol.claim_isolated, False)
        assert (claim.limit, claim.limit_alone) == (5, 2)
        # Holding one: the free slots only, and no second isolated job.
        [claim] = claimer.plan(running=2, waiting=0, avg_duration=0.001, holds_isolated=True, now=T)
        assert (claim.statement, claim.limit) == (protocol.claim, 2)
        # Due but jobs wait in the buffer: let it run empty first.
        [claim] = claimer.plan(running=1, waiting=1, avg_duration=0.001, now=T)
        assert claim.limit == 2

    def test_short_isolated_jobs_run_back_to_back_alone(self):
        claimer = self.claimer(prefetch=2)
        short = claims.SHORT_SECONDS / 10
        # Due, and jobs are short: the isolated job is claimed with nothing beside it.
        isolated, claim = claimer.plan(running=0, waiting=0, avg_duration=short, now=T)
        assert isolated.statement is protocol.claim_isolated
        assert claim.limit_alone == 0
        # While it is young (or has not started), nothing is claimed: it ends alone,
        # and the next cycle looks for the next isolated job.
        assert claimer.plan(running=1, waiting=0, avg_duration=short, holds_isolated=True,
                            now=T, isolated_since=None) == []  # fmt: skip
        assert claimer.plan(running=1, waiting=0, avg_duration=short, holds_isolated=True,
                            now=T, isolated_since=T - claims.ALONE_SECONDS / 2) == []  # fmt: skip
        # One that runs long after all: the free slots are filled, as for long jobs.
        [claim] = claimer.plan(running=1, waiting=0, avg_duration=short, holds_isolated=True,
                               now=T, isolated_since=T - 2 * claims.ALONE_SECONDS)  # fmt: skip
        assert (claim.statement, claim.limit) == (protocol.claim, 3)

    def test_claim_steps_against_the_database(self, conn, holdings):
        JobFactory.create_batch(3)
        JobFactory.create_batch(2, isolated=True)
        claimer = self.claimer(prefetch=2)
        with conn.cursor() as cur:
            steps = claimer.plan(running=0, waiting=0, avg_duration=None, now=T)
            claimed = claimer.claim(cur, steps, now=T)
        # One isolated job, then ordinary ones for the free slots only: no claim-ahead.
        assert [lease.isolated for lease in claimed] == [True, False, False, False]
        assert claimer.isolated_due == T  # It found one: it looks again once that is done.
        with conn.cursor() as cur:
            steps = claimer.plan(
                running=4, waiting=0, avg_duration=None, holds_isolated=True, now=T
            )
            assert claimer.claim(cur, steps, now=T) == []


class TestTimetable:
    def test_runs_what_is_due_adds_counts_and_carries_on_after_a_failure(self, conn, caplog):
        calls = []

        class Broken:
            name, interval, while_draining = "broken", 5.0, False

            def run_once(self, cursor, now):
                calls.append(("broken", now.monotonic))
                raise ValueError("boom")

        class Counting:
            name, interval, while_draining = "counting", 0.0, True

            def run_once(self, cursor, now):
                calls.append(("counting", now.monotonic))
                return ReapCounts(reaped=2)

        stats = Counters()
        schedule = Timetable([Broken(), Counting()], stats)
        with caplog.at_level(logging.ERROR):
            schedule.run_due(conn, T0)
        assert "broken failed; it runs again in 5.0s" in caplog.text
        assert stats.counts["reaped"] == 2
        assert schedule.earliest_due() == T0.monotonic + 5.0
        schedule.run_due(conn, T0._replace(monotonic=T0.monotonic + 1))  # broken not due
        schedule.run_due(conn, T0._replace(monotonic=T0.monotonic + 6), draining=True)
        assert calls == [
            ("broken", 1000.0),
            ("counting", 1000.0),
            ("counting", 1001.0),
            ("counting", 1006.0),  # While draining, only services that keep running.
        ]
        assert stats.counts["reaped"] == 6

    def test_a_lost_connection_goes_up_to_the_loop(self, conn):
        class Disconnected:
            name, interval, while_draining = "disconnected", 1.0, False

            def run_once(self, cursor, now):
                raise psycopg.OperationalError("server closed the connection")

        schedule = Timetable([Disconnected()], Counters())
        with pytest.raises(psycopg.OperationalError):
            schedule.run_due(conn, T0)
        assert schedule.earliest_due() == 0.0  # Runs first thing after the reconnect.
