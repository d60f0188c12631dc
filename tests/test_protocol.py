"""Each protocol statement on its own: happy path, stale token, wrong state.

These run the SQL of `protocol.py` directly against the real database; the
names follow the spec's actions.
"""

import contextlib
import datetime as dt

import psycopg
import pytest
from django.db import transaction
from django.utils import timezone

from django_conveyor import protocol
from django_conveyor.models import Job
from django_conveyor.operations import pause
from django_conveyor.worker.connections import connect
from tests.factories import JobFactory
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-a"


def row(job) -> Job:
    return Job.objects.get(pk=job.id)


def claim(cur, owner=OWNER, limit=10, queues=("default",)):
    return protocol.claim(cur, owner=owner, queues=queues, limit=limit, lease_seconds=30)


class ClaimStatement:
    """Shared cases: a claim takes ready jobs, each with a new token, never a locked one."""

    isolated = False  # The kind of job this claim takes.

    def claim(self, cur, owner=OWNER, limit=10, queues=("default",)):
        raise NotImplementedError

    def job(self, **fields):
        return JobFactory(isolated=self.isolated, **fields)

    def test_claims_bump_the_token_and_set_the_lease(self, cur):
        job = self.job(lease_version=4)
        [lease] = self.claim(cur)
        after = row(job)
        assert (lease.id, lease.version, lease.attempt) == (job.id, 5, 1)
        assert lease.isolated is self.isolated
        assert (after.state, after.lease_owner, after.lease_version) == ("running", OWNER, 5)
        assert after.lease_expires_at > timezone.now() + dt.timedelta(seconds=25)

    def test_respects_queue_run_after_and_pause(self, cur):
        self.job(queue="emails")
        self.job(run_after=timezone.now() + dt.timedelta(hours=1))
        assert self.claim(cur) == []
        pause(["emails"])
        assert self.claim(cur, queues=("emails",)) == []

    def test_skips_rows_locked_by_another_claimer(self, cur):
        first, second = self.job(), self.job()

        with connect("default") as other, other.transaction():
            other.execute("SELECT 1 FROM conveyor_job WHERE id = %s FOR UPDATE", [first.id])
            [lease] = self.claim(cur)  # the locked row is skipped, not waited on
            assert lease.id == second.id

    @pytest.mark.parametrize(
        "trait", ["running", "completed", "failed", "dead", "cancelled", "blocked"]
    )
    def test_only_available_jobs_are_claimed(self, cur, trait):
        self.job(**{trait: True})
        assert self.claim(cur) == []

    def test_leaves_the_other_kind_alone(self, cur):
        JobFactory(isolated=not self.isolated)
        assert self.claim(cur) == []


class TestClaim(ClaimStatement):
    def claim(self, cur, owner=OWNER, limit=10, queues=("default",)):
        return claim(cur, owner=owner, limit=limit, queues=queues)

    def test_respects_the_limit(self, cur):
        JobFactory.create_batch(3)
        assert len(self.claim(cur, limit=2)) == 2
        assert len(self.claim(cur, limit=10)) == 1


class TestClaimIsolated(ClaimStatement):
    isolated = True

    def claim(self, cur, owner=OWNER, limit=10, queues=("default",)):
        return protocol.claim_isolated(cur, owner=owner, queues=queues, lease_seconds=30)

    def test_takes_one_job_at_a_time(self, cur):
        JobFactory.create_batch(3, isolated=True)
        assert len(self.claim(cur)) == 1

    def test_not_for_a_worker_running_an_isolated_job(self, cur):
        JobFactory.create_batch(2, isolated=True)
        [first] = self.claim(cur)
        assert self.claim(cur) == []
        [other] = self.claim(cur, owner="worker-b")  # another worker may take the next
        assert other.id != first.id
        protocol.complete(cur, owner=OWNER, done=[(first.id, first.version, None)])
        JobFactory(isolated=True)
        assert len(self.claim(cur)) == 1  # its isolated job finished: the next one

    def test_beside_ordinary_running_jobs(self, cur):
        JobFactory(running=True)
        JobFactory(isolated=True)
        assert len(self.claim(cur)) == 1


class TestHeartbeat:
    def test_renews_only_matching_leases(self, cur):
        mine = JobFactory(running=True, lease_version=2)
        stale = JobFactory(running=True, lease_version=3)
        renewed = protocol.heartbeat(
            cur, owner=OWNER, held=[(mine.id, 2), (stale.id, 2)], lease_seconds=120
        )
        assert renewed == {mine.id}
        assert row(mine).lease_expires_at > timezone.now() + dt.timedelta(seconds=100)
        assert row(stale).lease_expires_at < timezone.now() + dt.timedelta(seconds=60)

    def test_a_row_locked_by_another_transaction_is_held_not_lost(self, cur):
        mine, other = JobFactory(running=True), JobFactory(running=True)
        from django_conveyor.worker.connections import connect

        with connect("default") as claimer, claimer.transaction():
            # What a concurrent CLAIM leaves behind on a row it looked at and let go.
            claimer.execute("SELECT 1 FROM conveyor_job WHERE id = %s FOR UPDATE", [mine.id])
            renewed = protocol.heartbeat(
                cur, owner=OWNER, held=[(mine.id, 1), (other.id, 1)], lease_seconds=30
            )
        assert renewed == {other.id}
        assert renewed.locked == {mine.id}

    def test_a_locked_row_of_another_token_is_lost(self, cur):
        theirs = JobFactory(running=True, lease_version=2)
        from django_conveyor.worker.connections import connect

        with connect("default") as claimer, claimer.transaction():
            claimer.execute("SELECT 1 FROM conveyor_job WHERE id = %s FOR UPDATE", [theirs.id])
            renewed = protocol.heartbeat(cur, owner=OWNER, held=[(theirs.id, 1)], lease_seconds=30)
        assert renewed == set() and renewed.locked == set()

    def test_other_owner_or_state_is_not_renewed(self, cur):
        theirs = JobFactory(running=True, lease_owner="worker-b")
        done = JobFactory(completed=True)
        assert (
            protocol.heartbeat(
                cur, owner=OWNER, held=[(theirs.id, 1), (done.id, 1)], lease_seconds=30
            )
            == set()
        )


class GuardedOutcome:
    """Shared cases: every outcome write is fenced by state, owner and version."""

    clears_isolated = True  # An outcome of the handler ends the job's isolation.

    def write(self, cur, job_id, version, owner=OWNER):
        raise NotImplementedError

    def test_what_becomes_of_isolation(self, cur):
        job = JobFactory(running=True, isolated=True)
        assert self.write(cur, job.id, 1)
        assert row(job).isolated is not self.clears_isolated

    def test_stale_token_writes_nothing(self, cur):
        job = JobFactory(running=True, lease_version=7)
        assert not self.write(cur, job.id, 6)
        assert row(job).state == "running"

    def test_other_owner_writes_nothing(self, cur):
        job = JobFactory(running=True)
        assert not self.write(cur, job.id, 1, owner="worker-b")
        assert row(job).state == "running"

    @pytest.mark.parametrize("trait", ["completed", "failed", "dead", "cancelled"])
    def test_wrong_state_writes_nothing(self, cur, trait):
        job = JobFactory(**{trait: True})
        before = row(job)
        assert not self.write(cur, job.id, before.lease_version)
        assert row(job).state == before.state


class TestComplete(GuardedOutcome):
    def write(self, cur, job_id, version, owner=OWNER):
        return protocol.complete(cur, owner=owner, done=[(job_id, version, {"ok": True})])

    def test_completes_with_the_return_value(self, cur):
        job = JobFactory(running=True)
        assert self.write(cur, job.id, 1) == {job.id}
        after = row(job)
        assert (after.state, after.return_value) == ("completed", {"ok": True})
        assert after.finished_at is not None and after.lease_expires_at is None


class TestRetry(GuardedOutcome):
    error = {"exception_class_path": "builtins.ValueError", "traceback": "tb"}

    def write(self, cur, job_id, version, owner=OWNER):
        return protocol.retry(cur, owner=owner, failures=[(job_id, version, 60.0, self.error)])

    def test_back_to_available_later_with_the_error(self, cur):
        job = JobFactory(running=True)
        assert self.write(cur, job.id, 1) == {job.id: "available"}
        after = row(job)
        assert after.state == "available"
        assert after.run_after > timezone.now() + dt.timedelta(seconds=50)
        [entry] = after.errors
        assert (entry["attempt"], entry["worker"], entry["token"]) == (1, OWNER, 1)

    def test_dead_when_attempts_are_used_up(self, cur):
        job = JobFactory(running=True, attempt=3, max_attempts=3)
        assert self.write(cur, job.id, 1) == {job.id: "dead"}
        assert row(job).finished_at is not None


class TestFail(GuardedOutcome):
    def write(self, cur, job_id, version, owner=OWNER):
        error = {"exception_class_path": "django_conveyor.exceptions.Discard", "traceback": "tb"}
        return protocol.fail(cur, owner=owner, failures=[(job_id, version, error)])

    def test_fails_at_once(self, cur):
        job = JobFactory(running=True, max_attempts=10)
        assert self.write(cur, job.id, 1) == {job.id}
        assert row(job).state == "failed"


class TestSnooze(GuardedOutcome):
    def write(self, cur, job_id, version, owner=OWNER):
        return protocol.snooze(cur, owner=owner, snoozed=[(job_id, version, 30.0, None)])

    def test_gives_the_attempt_back(self, cur):
        job = JobFactory(running=True, attempt=2)
        assert self.write(cur, job.id, 1) == {job.id}
        after = row(job)
        assert (after.state, after.attempt, after.errors) == ("available", 1, [])


class TestRelease(GuardedOutcome):
    clears_isolated = False  # The handler did not finish.

    def write(self, cur, job_id, version, owner=OWNER):
        return protocol.release(cur, owner=owner, held=[(job_id, version)])

    def test_hands_back_at_once(self, cur):
        job = JobFactory(running=True)
        assert self.write(cur, job.id, 1) == {job.id}
        after = row(job)
        assert (after.state, after.attempt, after.lease_expires_at) == ("available", 0, None)
        assert after.run_after <= timezone.now()


class TestLockForEffect(GuardedOutcome):
    clears_isolated = False  # Its COMPLETE does, in the same transaction.

    def write(self, cur, job_id, version, owner=OWNER):
        return protocol.lock_for_effect(cur, job_id=job_id, owner=owner, version=version)

    def test_locks_the_row_so_the_reaper_skips_it(self, cur):
        job = JobFactory(expired=True)

        with transaction.atomic():
            assert self.write(cur, job.id, 1)
            with connect("default") as other:
                assert protocol.reap(other.cursor()) == []  # locked: skipped
        with connect("default") as other:
            assert [r.id for r in protocol.reap(other.cursor())] == [job.id]


class TestBoundTransaction:
    """A guarded transaction whose session goes quiet ends, and its row lock with it."""

    @contextlib.contextmanager
    def locked_in_a_bounded_transaction(self, seconds=0.3):
        """(guarded cursor, reaper cursor, job) with the job's row locked by the first."""
        job = JobFactory(expired=True)
        with connect("default") as guarded, connect("default") as reaper:
            guarded.autocommit = False
            cur = guarded.cursor()
            protocol.bound_transaction(cur, seconds=seconds)
            assert protocol.lock_for_effect(cur, job_id=job.id, owner=OWNER, version=1)
            assert protocol.reap(reaper.cursor()) == []  # locked: skipped
            yield cur, reaper.cursor(), job

    def test_an_idle_guarded_transaction_is_ended_and_the_job_reaped(self):
        with self.locked_in_a_bounded_transaction() as (cur, reaper, job):
            # Once the session has been idle for the bound, PostgreSQL ends it.
            wait_until(lambda: [r.id for r in protocol.reap(reaper)] == [job.id])
            with pytest.raises(psycopg.Error):
                cur.execute("SELECT 1")
                cur.connection.commit()
        assert row(job).state == "available"

    def test_a_long_statement_is_cancelled_and_the_lock_released(self):
        with self.locked_in_a_bounded_transaction() as (cur, reaper, job):
            with pytest.raises(psycopg.errors.QueryCanceled):
                cur.execute("SELECT pg_sleep(30)")
            assert [r.id for r in protocol.reap(reaper)] == [job.id]

    def test_the_bound_ends_with_the_transaction(self):
        with connect("default") as conn:
            with conn.transaction():
                protocol.bound_transaction(conn.cursor(), seconds=0.3)
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("0",)
            assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)


class TestReap:
    def test_expired_lease_goes_back_with_a_lost_lease_error(self, cur):
        job = JobFactory(expired=True)
        live = JobFactory(running=True)
        [reaped] = protocol.reap(cur)
        assert (reaped.id, reaped.state, reaped.owner, reaped.version) == (
            job.id,
            "available",
            OWNER,
            1,
        )
        after = row(job)
        assert after.state == "available"
        assert after.errors[0]["exception_class_path"] == "django_conveyor.exceptions.LeaseLost"
        assert row(live).state == "running"

    def test_dead_when_attempts_are_used_up(self, cur):
        job = JobFactory(expired=True, attempt=3, max_attempts=3)
        protocol.reap(cur)
        assert row(job).state == "dead"

    def test_a_job_back_to_available_is_isolated(self, cur):
        back = JobFactory(expired=True)
        dead = JobFactory(expired=True, attempt=3, max_attempts=3, isolated=True)
        protocol.reap(cur)
        assert (row(back).state, row(back).isolated) == ("available", True)
        assert (row(dead).state, row(dead).isolated) == ("dead", False)
        assert claim(cur) == []  # CLAIM leaves it to CLAIM_ISOLATED

    def test_requeue_ends_isolation(self, cur):
        job = JobFactory(dead=True, isolated=True)
        assert protocol.requeue(cur, ids=[job.id]) == [job.id]
        assert row(job).isolated is False

    def test_zombie_writes_after_reap_and_reclaim_are_rejected(self, cur):
        job = JobFactory(expired=True)
        protocol.reap(cur)
        [lease] = TestClaimIsolated().claim(cur, owner="worker-b")
        assert lease.version == 2
        assert protocol.complete(cur, owner=OWNER, done=[(job.id, 1, "zombie")]) == set()
        assert protocol.heartbeat(cur, owner=OWNER, held=[(job.id, 1)], lease_seconds=30) == set()
        assert protocol.complete(cur, owner="worker-b", done=[(job.id, 2, "fresh")]) == {job.id}
        assert row(job).return_value == "fresh"


class TestRequeueAndCancel:
    @pytest.mark.parametrize("trait", ["failed", "dead", "cancelled"])
    def test_requeue_final_failures(self, cur, trait):
        job = JobFactory(**{trait: True})
        assert protocol.requeue(cur, ids=[job.id]) == [job.id]
        assert (row(job).state, row(job).attempt) == ("available", 0)

    @pytest.mark.parametrize("trait", ["running", "completed"])
    def test_requeue_refuses_others(self, cur, trait):
        job = JobFactory(**{trait: True})
        assert protocol.requeue(cur, ids=[job.id]) == []

    def test_cancel_only_unstarted(self, cur):
        waiting, blocked, running = JobFactory(), JobFactory(blocked=True), JobFactory(running=True)
        assert sorted(protocol.cancel(cur, ids=[waiting.id, blocked.id, running.id])) == sorted(
            [waiting.id, blocked.id]
        )
        assert row(running).state == "running"


def test_every_state_change_is_a_named_action():
    """A cheap guard that the module and the spec keep the same action names."""
    assert set(protocol.ACTIONS) >= {
        "ENQUEUE", "CLAIM", "HEARTBEAT", "COMPLETE", "RETRY", "FAIL", "SNOOZE",
        "RELEASE", "LOCK_FOR_EFFECT", "REAP", "REQUEUE", "CANCEL",
    }  # fmt: skip
    for name in protocol.ACTIONS:
        assert isinstance(getattr(protocol, name), str), name


class TestHistory:
    def test_requeue_and_cancel_record_who_and_what(self, cur):
        dead, waiting = JobFactory(dead=True), JobFactory()
        protocol.requeue(cur, ids=[dead.id], actor="admin:ops")
        protocol.cancel(cur, ids=[waiting.id], actor="cli")
        [entry] = row(dead).history
        assert (entry["actor"], entry["action"], entry["detail"]) == (
            "admin:ops",
            "requeue",
            "was dead",
        )
        [entry] = row(waiting).history
        assert (entry["actor"], entry["action"], entry["detail"]) == (
            "cli",
            "cancel",
            "was available",
        )
        assert "by cli" in row(waiting).errors[-1]["traceback"]

    def test_a_new_job_starts_with_an_empty_history(self, cur):
        new = protocol.NewJob("tests.testapp.tasks.add", [1, 2], {}, "default", "default", 0, 3)
        [enqueued] = protocol.enqueue(cur, [new], notify=False)
        job = Job.objects.get(pk=enqueued.id)
        assert (job.history, job.cancel_requested_at, job.cancel_requested_by) == ([], None, None)

    def test_the_default_actor_is_code(self, cur):
        job = JobFactory(failed=True)
        protocol.requeue(cur, ids=[job.id])
        assert row(job).history[0]["actor"] == "code"

    def test_refused_writes_leave_no_history(self, cur):
        done = JobFactory(completed=True)
        assert protocol.requeue(cur, ids=[done.id], actor="admin:ops") == []
        assert protocol.cancel(cur, ids=[done.id], actor="admin:ops") == []
        assert row(done).history == []


class TestRequestCancel:
    def test_records_the_request_on_a_running_job_without_changing_state(self, cur):
        job = JobFactory(running=True, lease_version=4)
        assert protocol.request_cancel(cur, ids=[job.id], actor="admin:ops") == [job.id]
        after = row(job)
        assert (after.state, after.lease_owner, after.lease_version) == ("running", OWNER, 4)
        assert after.cancel_requested_by == "admin:ops"
        assert after.cancel_requested_at is not None
        [entry] = after.history
        assert entry["action"] == "request_cancel"
        assert entry["detail"] == f"running on {OWNER} (token 4)"

    @pytest.mark.parametrize("trait", ["completed", "failed", "dead", "cancelled", "blocked"])
    def test_wrong_state_writes_nothing(self, cur, trait):
        job = JobFactory(**{trait: True})
        assert protocol.request_cancel(cur, ids=[job.id]) == []
        assert row(job).cancel_requested_at is None

    def test_available_jobs_are_for_cancel_not_for_a_request(self, cur):
        job = JobFactory()
        assert protocol.request_cancel(cur, ids=[job.id]) == []

    def test_the_first_request_stands(self, cur):
        job = JobFactory(running=True)
        protocol.request_cancel(cur, ids=[job.id], actor="admin:first")
        assert protocol.request_cancel(cur, ids=[job.id], actor="admin:second") == []
        assert row(job).cancel_requested_by == "admin:first"
        assert len(row(job).history) == 1

    def test_heartbeat_renews_and_reports_the_request(self, cur):
        asked, other = JobFactory(running=True), JobFactory(running=True)
        protocol.request_cancel(cur, ids=[asked.id])
        renewed = protocol.heartbeat(
            cur, owner=OWNER, held=[(asked.id, 1), (other.id, 1)], lease_seconds=60
        )
        assert renewed == {asked.id, other.id}
        assert renewed.cancel_requested == {asked.id}

    def test_lock_for_effect_refuses_a_job_with_a_request(self, cur):
        job = JobFactory(running=True)
        protocol.request_cancel(cur, ids=[job.id])
        with transaction.atomic():
            assert not protocol.lock_for_effect(cur, job_id=job.id, owner=OWNER, version=1)

    def test_an_expired_lease_with_a_request_is_reaped_to_cancelled(self, cur):
        job = JobFactory(expired=True)
        protocol.request_cancel(cur, ids=[job.id], actor="admin:ops")
        [reaped] = protocol.reap(cur)
        assert (reaped.id, reaped.state) == (job.id, "cancelled")
        after = row(job)
        assert (after.state, after.lease_owner) == ("cancelled", None)
        assert after.finished_at is not None
        error = after.errors[-1]
        assert error["exception_class_path"] == "django_conveyor.exceptions.Cancelled"
        assert "cancel request by admin:ops" in error["traceback"]

    @pytest.mark.parametrize("hand_back", ["retry", "snooze", "release"])
    def test_a_job_handed_back_after_a_request_ends_cancelled(self, cur, hand_back):
        """The handler ended before its worker was told: the job must not run again."""
        job = JobFactory(running=True, max_attempts=5)
        protocol.request_cancel(cur, ids=[job.id], actor="admin:ops")
        if hand_back == "retry":
            written = protocol.retry(cur, owner=OWNER, failures=[(job.id, 1, 0.0, {})])
            assert written == {job.id: "cancelled"}
        elif hand_back == "snooze":
            assert protocol.snooze(cur, owner=OWNER, snoozed=[(job.id, 1, 0.0, None)]) == {job.id}
        else:
            assert protocol.release(cur, owner=OWNER, held=[(job.id, 1)]) == {job.id}
        after = row(job)
        assert (after.state, after.lease_owner) == ("cancelled", None)
        assert after.finished_at is not None
        assert claim(cur) == []

    def test_requeue_clears_the_request(self, cur):
        job = JobFactory(running=True)
        protocol.request_cancel(cur, ids=[job.id], actor="admin:ops")
        protocol.cancel_held(cur, owner=OWNER, held=[(job.id, 1)])
        assert protocol.requeue(cur, ids=[job.id]) == [job.id]
        after = row(job)
        assert (after.state, after.cancel_requested_at, after.cancel_requested_by) == (
            "available",
            None,
            None,
        )
        [lease] = claim(cur)
        assert lease.id == job.id
        with transaction.atomic():
            assert protocol.lock_for_effect(cur, job_id=job.id, owner=OWNER, version=2)


class TestCancelHeld(GuardedOutcome):
    def write(self, cur, job_id, version, owner=OWNER):
        protocol.request_cancel(cur, ids=[job_id], actor="admin:ops")
        return protocol.cancel_held(
            cur, owner=owner, held=[(job_id, version)], actor=f"worker:{owner}"
        )

    def test_the_holder_cancels_and_says_who_asked(self, cur):
        job = JobFactory(running=True)
        assert self.write(cur, job.id, 1) == {job.id}
        after = row(job)
        assert (after.state, after.lease_owner, after.lease_expires_at) == ("cancelled", None, None)
        error = after.errors[-1]
        assert error["exception_class_path"] == "django_conveyor.exceptions.Cancelled"
        assert error["traceback"] == "Cancelled while running, at the request of admin:ops."
        assert (error["worker"], error["token"]) == (OWNER, 1)
        assert [e["action"] for e in after.history] == ["request_cancel", "cancel_held"]
        assert after.history[-1]["actor"] == f"worker:{OWNER}"

    def test_without_a_request_nothing_is_written(self, cur):
        job = JobFactory(running=True)
        assert protocol.cancel_held(cur, owner=OWNER, held=[(job.id, 1)]) == set()
        assert row(job).state == "running"

    def test_the_handlers_own_outcome_is_then_refused(self, cur):
        job = JobFactory(running=True)
        self.write(cur, job.id, 1)
        assert protocol.complete(cur, owner=OWNER, done=[(job.id, 1, "late")]) == set()
        assert row(job).state == "cancelled"
