"""The slot pool hands short jobs over in batches, and gives back what no slot started.

Real jobs, claimed with CLAIM from the test database, run by real slot
threads through the executor; `gated` blocks its handler until the test
opens the gate, so the test can look at the pool while a slot holds a batch.
"""

import threading

import pytest

from django_conveyor import protocol
from django_conveyor.worker.attempts import COMPLETE, Attempt, Outcome
from django_conveyor.worker.connections import connect
from django_conveyor.worker.handlers import slots
from django_conveyor.worker.handlers.slots import SlotPool
from tests.helpers import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def claimed_gated(n: int) -> list[Attempt]:
    for i in range(n):
        tasks.gated.enqueue(f"job-{i}")
    with connect("default") as conn, conn.cursor() as cur:  # jsonb decoded, as the worker's
        leases = protocol.claim(
            cur, owner="test-slots", queues=["default"], limit=n, lease_seconds=60
        )
    assert len(leases) == n
    return [Attempt(lease, "default") for lease in leases]


@pytest.fixture
def gate():
    tasks.GATE.clear()
    yield tasks.GATE
    tasks.GATE.set()


class Reported:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: list[Outcome] = []

    def __call__(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def count(self) -> int:
        with self.lock:
            return len(self.outcomes)


def test_a_slot_takes_short_jobs_as_a_batch_and_shutdown_gets_back_the_unstarted(gate):
    attempts = claimed_gated(10)
    reported = Reported()
    pool = SlotPool(1, reported)
    pool.avg_duration = slots.BATCH_BELOW_SECONDS / 10  # Short jobs: batches.
    pool.start()
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        # The one slot took all ten and runs the first: nine wait, in its batch.
        assert pool.waiting() == 9
        assert not pool.ready
        back = pool.take_waiting()
        assert back == attempts[1:]
        assert pool.waiting() == 0
        gate.set()
        wait_until(lambda: reported.count() == 1)
        assert [o.attempt for o in reported.outcomes] == [attempts[0]]
        assert reported.outcomes[0].kind == COMPLETE
    finally:
        gate.set()
        pool.stop()
    wait_until(lambda: not pool.slots)
    assert reported.count() == 1  # Nothing handed back was started afterwards.


def test_long_jobs_go_one_at_a_time(gate):
    attempts = claimed_gated(3)
    reported = Reported()
    pool = SlotPool(1, reported)
    pool.avg_duration = slots.BATCH_BELOW_SECONDS * 10  # Long jobs: one per take.
    pool.start()
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        assert len(pool.ready) == 2  # Still in the shared queue, for any slot.
        assert pool.waiting() == 2
    finally:
        gate.set()
        pool.stop()
    wait_until(lambda: reported.count() == 3)
    assert sorted(o.attempt.lease.id for o in reported.outcomes) == sorted(
        a.lease.id for a in attempts
    )


def test_an_abandoned_slot_leaves_its_unstarted_batch_to_the_slot_that_replaces_it(gate):
    attempts = claimed_gated(3)
    reported = Reported()
    pool = SlotPool(1, reported)
    pool.avg_duration = slots.BATCH_BELOW_SECONDS / 10
    pool.start()
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        assert pool.waiting() == 2
        assert pool.abandon(attempts[0])
        # The new slot starts the second job; the abandoned thread is still inside the first.
        wait_until(lambda: pool.running() == 1 and pool.waiting() == 1)
        assert pool.in_handlers() == 2
        gate.set()
        wait_until(lambda: reported.count() == 3)
    finally:
        gate.set()
        pool.stop()
    assert {o.attempt.lease.id for o in reported.outcomes} == {a.lease.id for a in attempts}
    wait_until(lambda: not pool.slots)


def test_a_job_lost_before_it_started_is_skipped(gate):
    attempts = claimed_gated(2)
    reported = Reported()
    pool = SlotPool(1, reported)
    pool.avg_duration = slots.BATCH_BELOW_SECONDS / 10
    attempts[1].mark_lost("handed back")  # Before any slot took it.
    pool.start()
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        gate.set()
        wait_until(lambda: pool.running() == 0 and pool.waiting() == 0)
    finally:
        gate.set()
        pool.stop()
    wait_until(lambda: not pool.slots)
    assert [o.attempt for o in reported.outcomes] == [attempts[0]]
