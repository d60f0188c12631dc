"""The slot pool wakes slots by need, and gives back what no slot started.

Real jobs, claimed with CLAIM from the test database, run by real slot
threads through the executor; `gated` blocks its handler until the test
opens the gate, so the test can look at the pool while slots are inside it.
"""

import threading
import time

import pytest

from django_conveyor import protocol
from django_conveyor.worker.attempts import COMPLETE, Attempt, Outcome
from django_conveyor.worker.connections import connect
from django_conveyor.worker.handlers import slots
from django_conveyor.worker.handlers.slots import SlotPool
from tests.helpers import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

SHORT = slots.SHORT_JOB_SECONDS / 10
LONG = slots.SHORT_JOB_SECONDS * 10


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


def started_pool(size: int, reported: Reported, average: float) -> SlotPool:
    pool = SlotPool(size, reported)
    pool.avg_duration = average
    pool.start()
    wait_until(lambda: len(pool.sleeping) == size)  # Every slot found nothing to do.
    return pool


def test_one_slot_runs_a_short_queue_and_shutdown_gets_back_the_unstarted(gate):
    attempts = claimed_gated(10)
    reported = Reported()
    pool = started_pool(4, reported, SHORT)
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        # Ten short jobs are far less work than one slot's budget: one slot is woken.
        assert len(pool.sleeping) == 3
        assert pool.waiting() == 9
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


def test_queued_work_wakes_a_slot_per_budget():
    pool = SlotPool(8, lambda outcome: None)
    pool.avg_duration = SHORT
    per_slot = int(slots.QUEUE_BUDGET_SECONDS / SHORT)  # Short jobs one slot gets through.
    pool.ready.extend([object()] * (3 * per_slot))  # type: ignore[list-item]
    assert pool.wanted() == 3
    pool.ready.extend([object()] * (10 * per_slot))  # type: ignore[list-item]
    assert pool.wanted() == 13  # More than the pool has: it wakes what it has.
    pool.avg_duration = LONG
    assert pool.wanted() == len(pool.ready)  # Long jobs: one slot each.
    pool.ready.clear()
    assert pool.wanted() == 0


def test_long_jobs_each_get_a_slot(gate):
    attempts = claimed_gated(3)
    reported = Reported()
    pool = started_pool(3, reported, LONG)
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 3)
        assert pool.waiting() == 0
        assert not pool.sleeping
    finally:
        gate.set()
        pool.stop()
    wait_until(lambda: reported.count() == 3)
    assert sorted(o.attempt.lease.id for o in reported.outcomes) == sorted(
        a.lease.id for a in attempts
    )


def test_a_slot_stuck_in_a_short_job_gets_help(gate):
    attempts = claimed_gated(3)
    reported = Reported()
    pool = started_pool(2, reported, SHORT)
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        pool.keep_up(time.monotonic())  # Not stuck for long yet: nothing changes.
        assert (pool.running(), pool.waiting()) == (1, 2)
        pool.keep_up(time.monotonic() + slots.STALL_SECONDS)
        wait_until(lambda: pool.running() == 2)  # The second slot took the next job.
        assert pool.waiting() == 1
    finally:
        gate.set()
        pool.stop()
    wait_until(lambda: reported.count() == 3)


def test_jobs_that_turn_out_long_get_their_slots(gate):
    attempts = claimed_gated(3)
    reported = Reported()
    pool = started_pool(3, reported, SHORT)
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)  # Short work: one slot for the three.
        pool.avg_duration = LONG  # The average has grown: each waiting job needs a slot.
        pool.keep_up(time.monotonic())
        wait_until(lambda: pool.running() == 3)
        assert pool.waiting() == 0
    finally:
        gate.set()
        pool.stop()
    wait_until(lambda: reported.count() == 3)


def test_an_abandoned_slot_is_replaced_and_the_queue_goes_on(gate):
    attempts = claimed_gated(3)
    reported = Reported()
    pool = started_pool(1, reported, SHORT)
    try:
        pool.submit(attempts)
        wait_until(lambda: pool.running() == 1)
        assert pool.waiting() == 2
        assert pool.abandon(attempts[0])
        # The new slot starts the second job; the abandoned thread is still inside the first.
        wait_until(lambda: pool.running() == 1 and pool.waiting() == 1)
        assert pool.in_handlers() == 2
        assert pool.running_attempts() == [attempts[1]]
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
    attempts[1].mark_lost("handed back")  # Before any slot took it.
    pool = started_pool(1, reported, SHORT)
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
