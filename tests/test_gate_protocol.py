"""The gate statements on their own: SIGNAL, CONDITION_MET, GATE_TIMEOUT, and the
workflow statements that keep a gate blocked (ENQUEUE, UNBLOCK, CANCEL_DEPENDENTS,
REBLOCK_DEPENDENTS, REQUEUE), against the real database."""

import threading

import pytest
from django.db import connection, connections

from django_conveyor import protocol
from django_conveyor.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

OWNER = "worker-a"
SIGNAL_GATE = {"kind": "signal", "signal": "approval", "on_timeout": "fail"}


@pytest.fixture
def cur():
    with connection.cursor() as cursor:
        yield cursor


def new(cur, *depends_on, gate=None, policy="cancel"):
    job = protocol.NewJob(
        task_path="django_conveyor.workflows.gates.signal" if gate else "tests.testapp.tasks.add",
        args=[], kwargs={}, queue="default", backend="default", priority=0, max_attempts=1,
        depends_on=tuple(depends_on), dependency_policy=policy, gate=gate,
    )  # fmt: skip
    return protocol.enqueue(cur, [job], notify=False)[0].id


def row(job_id):
    return Job.objects.get(pk=job_id)


def claim_all(cur):
    return protocol.claim(cur, owner=OWNER, queues=["default"], limit=100, lease_seconds=30)


def finish(cur, job_id):
    [lease] = [lease for lease in claim_all(cur) if lease.id == job_id]
    assert protocol.complete(cur, owner=OWNER, done=[(job_id, lease.version, 1)]) == {job_id}


def signal(cur, gate_id, name="approval", payload='{"ok": true}', reject=False):
    return protocol.signal(
        cur, gate_id=gate_id, name=name, payload=payload, reject=reject, reason=None,
        actor="test",
    )  # fmt: skip


class TestGateStaysBlocked:
    def test_a_gate_without_upstream_waits_at_once_and_is_never_claimed(self, cur):
        gate = new(cur, gate={**SIGNAL_GATE, "seconds": 60})
        job = row(gate)
        assert (job.state, job.pending_dependencies) == ("blocked", 0)
        assert job.gate_deadline is not None
        assert claim_all(cur) == []

    def test_unblock_arms_a_gate_instead_of_making_it_available(self, cur):
        first = new(cur)
        gate = new(cur, first, gate={**SIGNAL_GATE, "seconds": 60})
        assert row(gate).gate_deadline is None  # Not waiting yet: no deadline.
        finish(cur, first)
        job = row(gate)
        assert (job.state, job.pending_dependencies) == ("blocked", 0)
        assert job.gate_deadline > job.enqueued_at
        assert claim_all(cur) == []

    def test_a_run_policy_gate_waits_once_its_upstream_failed(self, cur):
        first = new(cur)
        gate = new(cur, first, gate=SIGNAL_GATE, policy="run")
        [lease] = claim_all(cur)
        protocol.fail(cur, owner=OWNER, failures=[(first, lease.version, {"traceback": "x"})])
        assert (row(gate).state, row(gate).pending_dependencies) == ("blocked", 0)
        assert claim_all(cur) == []


class TestSignal:
    def test_completes_the_gate_with_its_payload_and_unblocks_its_dependents(self, cur):
        gate = new(cur, gate=SIGNAL_GATE)
        after = new(cur, gate)
        assert signal(cur, gate) == "completed"
        assert (row(gate).state, row(gate).return_value) == ("completed", {"ok": True})
        assert row(gate).history[-1]["action"] == "signal"
        assert row(after).state == "available"

    def test_a_rejection_fails_the_gate_and_cancels_its_dependents(self, cur):
        gate = new(cur, gate=SIGNAL_GATE)
        after = new(cur, gate)
        assert signal(cur, gate, reject=True, payload=None) == "failed"
        assert row(gate).errors[-1]["exception_class_path"].endswith("SignalRejected")
        assert row(after).state == "cancelled"

    @pytest.mark.parametrize("name", ["other", "approvals"])
    def test_another_name_matches_no_row(self, cur, name):
        gate = new(cur, gate=SIGNAL_GATE)
        assert signal(cur, gate, name=name) is None
        assert row(gate).state == "blocked"

    def test_before_the_upstream_is_done_it_matches_no_row(self, cur):
        first = new(cur)
        gate = new(cur, first, gate=SIGNAL_GATE)
        assert signal(cur, gate) is None
        assert row(gate).state == "blocked"

    def test_a_second_signal_matches_no_row(self, cur):
        gate = new(cur, gate=SIGNAL_GATE)
        assert signal(cur, gate) == "completed"
        assert signal(cur, gate, payload='{"ok": false}') is None
        assert row(gate).return_value == {"ok": True}

    def test_an_ordinary_job_takes_no_signal(self, cur):
        job = new(cur)
        assert signal(cur, job) is None


class TestGateTimeout:
    def test_a_timer_completes_at_its_deadline(self, cur):
        timer = new(cur, gate={"kind": "sleep", "seconds": 0})
        after = new(cur, timer)
        ended = protocol.gate_timeout(cur, limit=10)
        assert [(e.id, e.state) for e in ended] == [(timer, "completed")]
        assert "slept_until" in row(timer).return_value
        assert row(after).state == "available"

    def test_on_timeout_fail_fails_the_gate(self, cur):
        gate = new(cur, gate={**SIGNAL_GATE, "seconds": 0})
        after = new(cur, gate)
        assert [e.state for e in protocol.gate_timeout(cur, limit=10)] == ["failed"]
        assert row(gate).errors[-1]["exception_class_path"].endswith("GateTimedOut")
        assert row(after).state == "cancelled"
        assert signal(cur, gate) is None

    def test_on_timeout_continue_completes_with_the_marker(self, cur):
        gate = new(cur, gate={**SIGNAL_GATE, "seconds": 0, "on_timeout": "continue"})
        protocol.gate_timeout(cur, limit=10)
        assert row(gate).state == "completed"
        assert row(gate).return_value["timed_out"] is True

    def test_a_gate_not_yet_due_is_left_alone(self, cur):
        gate = new(cur, gate={**SIGNAL_GATE, "seconds": 3600})
        assert protocol.gate_timeout(cur, limit=10) == []
        assert row(gate).state == "blocked"

    def test_the_batch_is_bounded(self, cur):
        for _ in range(5):
            new(cur, gate={"kind": "sleep", "seconds": 0})
        assert len(protocol.gate_timeout(cur, limit=3)) == 3
        assert len(protocol.gate_timeout(cur, limit=3)) == 2


class TestRequeue:
    def test_a_timed_out_gate_waits_again_with_a_new_deadline(self, cur):
        gate = new(cur, gate={**SIGNAL_GATE, "seconds": 0})
        after = new(cur, gate)
        protocol.gate_timeout(cur, limit=10)
        assert protocol.requeue(cur, ids=[gate], notify=False) == [gate]
        job = row(gate)
        assert (job.state, job.pending_dependencies) == ("blocked", 0)
        assert job.gate_deadline is not None
        assert row(after).state == "blocked"  # Its dependent, cancelled by it, waits again.
        assert signal(cur, gate) == "completed"
        assert row(after).state == "available"

    def test_a_gate_cancelled_by_its_upstream_comes_back_with_it(self, cur):
        first = new(cur)
        gate = new(cur, first, gate={**SIGNAL_GATE, "seconds": 60})
        [lease] = claim_all(cur)
        protocol.fail(cur, owner=OWNER, failures=[(first, lease.version, {"traceback": "x"})])
        assert row(gate).state == "cancelled"
        protocol.requeue(cur, ids=[first], notify=False)
        job = row(gate)
        assert (job.state, job.pending_dependencies, job.gate_deadline) == ("blocked", 1, None)


class TestSignalRacesTimeout:
    def test_exactly_one_outcome_under_many_threads(self, django_db_blocker):
        """Threads signal while others fire the timeout: one outcome per gate, never two."""
        with connection.cursor() as cur:
            gates = [new(cur, gate={**SIGNAL_GATE, "seconds": 0}) for _ in range(40)]
        outcomes = {"signal": [], "timeout": []}
        start = threading.Barrier(6)

        def signaller():
            start.wait()
            with connections["default"].cursor() as cur:
                for gate in gates:
                    if signal(cur, gate) == "completed":
                        outcomes["signal"].append(gate)
            connections["default"].close()

        def timer():
            start.wait()
            with connections["default"].cursor() as cur:
                for _ in range(10):
                    outcomes["timeout"] += [e.id for e in protocol.gate_timeout(cur, limit=4)]
            connections["default"].close()

        threads = [threading.Thread(target=f) for f in (signaller,) * 3 + (timer,) * 3]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ended = outcomes["signal"] + outcomes["timeout"]
        assert sorted(ended) == sorted(gates)  # Each gate once, by one of them.
        for gate in gates:
            assert row(gate).state in ("completed", "failed")
