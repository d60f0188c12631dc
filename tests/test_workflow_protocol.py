"""The workflow statements on their own: UNBLOCK, CANCEL_DEPENDENTS, REBLOCK_DEPENDENTS.

Each runs inside the protocol function that owns its transaction (COMPLETE,
FAIL, RETRY, REAP, CANCEL, CANCEL_HELD, REQUEUE), against the real database.
"""

import psycopg
import pytest

from django_conveyor import protocol
from django_conveyor.exceptions import (
    DependencyAlreadyFailed,
    DependencyNotFound,
    TooManyDependencies,
)
from django_conveyor.models import Dependency, Job
from django_conveyor.worker.connections import connect
from tests.helpers import direct_dsn

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-a"


def new(cur, *depends_on, policy="cancel", key=None, attempts=1):
    job = protocol.NewJob(
        task_path="tests.testapp.tasks.add",
        args=[],
        kwargs={},
        queue="default",
        backend="default",
        priority=0,
        max_attempts=attempts,
        idempotency_key=key,
        depends_on=tuple(depends_on),
        dependency_policy=policy,
    )
    return protocol.enqueue(cur, [job], notify=False)[0].id


def state(job_id):
    return Job.objects.get(pk=job_id).state


def pending(job_id):
    return Job.objects.get(pk=job_id).pending_dependencies


def run(cur, job_id, owner=OWNER):
    """Claim exactly this job (it must be the only available one); returns its version."""
    [lease] = protocol.claim(cur, owner=owner, queues=["default"], limit=1, lease_seconds=30)
    assert lease.id == job_id
    return lease.version


def finish(cur, job_id, owner=OWNER):
    version = run(cur, job_id, owner)
    assert protocol.complete(cur, owner=owner, done=[(job_id, version, job_id)]) == {job_id}


def fail(cur, job_id):
    version = run(cur, job_id)
    assert protocol.fail(cur, owner=OWNER, failures=[(job_id, version, {"traceback": "x"})])


class TestEnqueue:
    def test_unfinished_dependencies_block_with_their_count(self, cur):
        a, b = new(cur), new(cur)
        c = new(cur, a, b, a)
        assert (state(c), pending(c)) == ("blocked", 2)
        assert sorted(Dependency.objects.filter(job_id=c).values_list("depends_on_id", flat=True))
        assert set(Dependency.objects.filter(job_id=c).values_list("depends_on_id", flat=True)) == {
            a,
            b,
        }

    def test_completed_dependencies_are_already_satisfied(self, cur):
        a = new(cur)
        finish(cur, a)
        b = new(cur, a)
        assert (state(b), pending(b)) == ("available", 0)

    def test_unknown_ids_are_refused_before_any_write(self, cur):
        before = Job.objects.count()
        with pytest.raises(DependencyNotFound, match="Dependency 999999 of a"):
            new(cur, 999999)
        assert Job.objects.count() == before

    @pytest.mark.parametrize("how", ["cancelled", "failed"])
    def test_a_dependency_that_already_failed_is_refused_under_policy_cancel(self, cur, how):
        a = new(cur)
        if how == "cancelled":
            protocol.cancel(cur, ids=[a])
        else:
            fail(cur, a)
        with pytest.raises(DependencyAlreadyFailed, match=f"is already {how}"):
            new(cur, a)
        b = new(cur, a, policy="run")
        assert state(b) == "available"

    def test_more_than_the_limit_is_refused(self, cur, monkeypatch):
        monkeypatch.setattr(protocol, "MAX_DEPENDENCIES", 2)
        a, b, c = new(cur), new(cur), new(cur)
        with pytest.raises(TooManyDependencies, match="names 3 dependencies; the limit is 2"):
            new(cur, a, b, c)

    def test_an_idempotent_replay_adds_no_edges(self, cur):
        a, b = new(cur), new(cur)
        first = new(cur, a, key="k")
        assert new(cur, a, key="k") == first
        assert Dependency.objects.filter(job_id=first).count() == 1
        del b


class TestUnblock:
    def test_the_last_completed_dependency_makes_the_dependent_available(self, cur):
        a, b = new(cur), new(cur)
        c = new(cur, a, b)
        finish(cur, a)
        assert (state(c), pending(c)) == ("blocked", 1)
        finish(cur, b)
        assert (state(c), pending(c)) == ("available", 0)

    def test_a_stale_completion_unblocks_nothing(self, cur):
        a = new(cur, attempts=2)
        b = new(cur, a)
        version = run(cur, a)
        # The lease is taken: the reaper hands it back, another worker claims it.
        Job.objects.filter(pk=a).update(lease_expires_at="2000-01-01T00:00:00Z")
        protocol.reap(cur)
        # Reaped back to available, it is isolated: only CLAIM_ISOLATED takes it.
        [lease] = protocol.claim_isolated(
            cur, owner="worker-b", queues=["default"], lease_seconds=30
        )
        assert lease.id == a
        assert protocol.complete(cur, owner=OWNER, done=[(a, version, None)]) == set()
        assert (state(b), pending(b)) == ("blocked", 1)

    def test_one_completion_of_two_dependencies_counts_both(self, cur):
        a, b = new(cur), new(cur)
        c = new(cur, a, b)
        leases = protocol.claim(cur, owner=OWNER, queues=["default"], limit=2, lease_seconds=30)
        assert {lease.id for lease in leases} == {a, b}
        done = [(lease.id, lease.version, None) for lease in leases]
        assert protocol.complete(cur, owner=OWNER, done=done) == {a, b}
        assert (state(c), pending(c)) == ("available", 0)

    def test_a_dependent_made_available_wakes_its_queue_on_commit(self):
        # LISTEN on a direct connection: a pooler in transaction mode loses it.
        dsn = direct_dsn()
        listening = psycopg.connect(dsn, autocommit=True) if dsn else connect("default")
        with listening as listener:
            listener.execute(f"LISTEN {protocol.NOTIFY_CHANNEL}")
            with connect("default") as conn, conn.cursor() as cur:
                a = new(cur)
                new(cur, a)
                with conn.transaction():
                    finish(cur, a)
                    assert not list(listener.notifies(timeout=0.2, stop_after=1))  # Not before.
            heard = list(listener.notifies(timeout=5, stop_after=1))
        assert [(n.channel, n.payload) for n in heard] == [(protocol.NOTIFY_CHANNEL, "default")]

    def test_a_chain_unblocks_one_step_at_a_time(self, cur):
        steps = [new(cur)]
        for _ in range(4):
            steps.append(new(cur, steps[-1]))
        for i, step in enumerate(steps):
            assert [state(s) for s in steps[i:]] == ["available"] + ["blocked"] * (4 - i)
            finish(cur, step)


class TestCancelDependents:
    def test_a_failed_dependency_cancels_its_dependents_transitively(self, cur):
        a = new(cur)
        b = new(cur, a)
        c = new(cur, b)
        fail(cur, a)
        assert (state(b), state(c)) == ("cancelled", "cancelled")
        [entry] = Job.objects.get(pk=b).errors
        assert entry["exception_class_path"] == "django_conveyor.exceptions.DependencyFailed"
        assert entry["dependency"] == a
        assert entry["traceback"].startswith(f"Dependency {a} (tests.testapp.tasks.add) ended")
        assert Job.objects.get(pk=c).errors[-1]["dependency"] == b

    def test_a_run_anyway_dependent_runs_once_every_dependency_is_final(self, cur):
        a, b = new(cur), new(cur)
        cleanup = new(cur, a, b, policy="run")
        fail(cur, a)
        assert (state(cleanup), pending(cleanup)) == ("blocked", 1)
        finish(cur, b)
        assert state(cleanup) == "available"

    def test_retry_to_dead_and_operator_cancel_cancel_dependents(self, cur):
        a = new(cur)
        b = new(cur, a)
        version = run(cur, a)
        assert protocol.retry(cur, owner=OWNER, failures=[(a, version, 0, {})]) == {a: "dead"}
        assert state(b) == "cancelled"
        c = new(cur)
        d = new(cur, c)
        protocol.cancel(cur, ids=[c])
        assert state(d) == "cancelled"

    def test_a_reaped_dead_dependency_cancels_its_dependents(self, cur):
        a = new(cur)
        b = new(cur, a)
        run(cur, a)
        Job.objects.filter(pk=a).update(lease_expires_at="2000-01-01T00:00:00Z")
        [reaped] = protocol.reap(cur)
        assert reaped.state == "dead"
        assert state(b) == "cancelled"

    def test_cancel_held_cancels_dependents(self, cur):
        a = new(cur)
        b = new(cur, a)
        version = run(cur, a)
        protocol.request_cancel(cur, ids=[a])
        assert protocol.cancel_held(cur, owner=OWNER, held=[(a, version)]) == {a}
        assert state(b) == "cancelled"


class TestReblock:
    def test_requeue_brings_back_what_the_failure_cancelled(self, cur):
        a = new(cur)
        b = new(cur, a)
        c = new(cur, b)
        cleanup = new(cur, b, policy="run")
        fail(cur, a)
        assert [state(j) for j in (b, c, cleanup)] == ["cancelled", "cancelled", "available"]
        assert protocol.requeue(cur, ids=[a]) == [a]
        assert [state(j) for j in (a, b, c, cleanup)] == ["available"] + ["blocked"] * 3
        assert (pending(b), pending(c), pending(cleanup)) == (1, 1, 1)
        assert Job.objects.get(pk=b).history[-1]["action"] == "reblock"
        finish(cur, a)
        finish(cur, b)
        assert (state(c), state(cleanup)) == ("available", "available")

    def test_an_operators_cancel_is_not_undone(self, cur):
        a = new(cur)
        b = new(cur, a)
        protocol.cancel(cur, ids=[b])
        fail(cur, a)
        protocol.requeue(cur, ids=[a])
        assert state(b) == "cancelled"

    def test_a_job_stays_cancelled_while_another_dependency_is_broken(self, cur):
        a, b = new(cur), new(cur)
        c = new(cur, a, b)
        fail(cur, a)
        fail(cur, b)
        protocol.requeue(cur, ids=[a])
        assert state(c) == "cancelled"
        protocol.requeue(cur, ids=[b])
        assert (state(c), pending(c)) == ("blocked", 2)

    def test_a_run_anyway_dependent_waits_again_for_a_requeued_dependency(self, cur):
        a, b = new(cur), new(cur)
        cleanup = new(cur, a, b, policy="run")
        fail(cur, a)
        assert pending(cleanup) == 1
        protocol.requeue(cur, ids=[a])
        assert (state(cleanup), pending(cleanup)) == ("blocked", 2)
        finish(cur, b)
        assert state(cleanup) == "blocked"
        finish(cur, a)
        assert state(cleanup) == "available"

    def test_a_dependent_requeued_directly_waits_for_its_dependencies(self, cur):
        a = new(cur)
        b = new(cur, a)
        protocol.cancel(cur, ids=[b])
        assert protocol.requeue(cur, ids=[b]) == [b]
        assert (state(b), pending(b)) == ("blocked", 1)
        finish(cur, a)
        assert state(b) == "available"

    def test_requeue_refuses_a_dependent_of_a_broken_dependency(self, cur):
        a = new(cur)
        b = new(cur, a)
        fail(cur, a)
        assert protocol.requeue(cur, ids=[b]) == []
        assert state(b) == "cancelled"


def test_prune_deletes_the_edges_of_pruned_jobs(cur):
    a = new(cur)
    b = new(cur, a)
    finish(cur, a)
    finish(cur, b)
    assert protocol.prune(cur, older_than_seconds=-60, queues=["default"], limit=10) == 2
    assert not Dependency.objects.exists()
