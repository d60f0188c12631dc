"""What a worker may start, and what REAP makes of the rest (docs/guarantees.md,
"Crash containment"): a job its dead worker never listed as may-start goes
back with its attempt, not into isolation; a listed one is isolated as before."""

import os
import signal

import pytest
from django.utils import timezone

from django_conveyor import protocol
from django_conveyor.models import Job, Worker
from django_conveyor.worker.attempts import Attempt
from django_conveyor.worker.claims import MAX_START_WINDOW
from django_conveyor.worker.config import WorkerOptions
from django_conveyor.worker.cycles import Cycle
from django_conveyor.worker.loop import Worker as WorkerLoop
from django_conveyor.worker.starts import StartWindow
from tests.factories import JobFactory
from tests.helpers import start_logged_worker, wait_until
from tests.testapp import tasks
from tests.testapp.models import Effect

OWNER = "worker-a"
UNSTARTED = {"exception_class_path": "django_conveyor.exceptions.LeaseLost", "unstarted": True}


def registered(may_start: list[int] | None, owner: str = OWNER) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=owner, host="h", pid=1, concurrency=2, started_at=now, last_seen_at=now,
        version="t", may_start=may_start,
    )  # fmt: skip


def row(job) -> Job:
    return Job.objects.get(pk=job.id)


@pytest.mark.django_db
class TestReapReadsTheList:
    def test_a_listed_job_is_isolated_and_its_attempt_counts(self, cur):
        job = JobFactory(expired=True)
        registered([job.id])
        [reaped] = protocol.reap(cur)
        assert (reaped.state, reaped.started) == ("available", True)
        after = row(job)
        assert (after.state, after.isolated, after.attempt) == ("available", True, 1)
        assert "unstarted" not in after.errors[-1]

    def test_an_unlisted_job_goes_back_with_its_attempt(self, cur):
        job, listed = JobFactory(expired=True), JobFactory(expired=True)
        registered([listed.id])
        reaped = {r.id: r for r in protocol.reap(cur)}
        assert (reaped[job.id].state, reaped[job.id].started) == ("available", False)
        after = row(job)
        assert (after.state, after.isolated, after.attempt) == ("available", False, 0)
        assert after.errors[-1].items() >= {**UNSTARTED, "attempt": 1}.items()
        assert after.lease_owner is None and after.lease_version == 1  # The token stays spent.
        assert [lease.id for lease in protocol.claim(
            cur, owner="worker-b", queues=("default",), limit=10, lease_seconds=30
        )] == [job.id]  # fmt: skip

    def test_no_list_and_no_row_both_mean_any_job_may_have_started(self, cur):
        unlisted_owner = JobFactory(expired=True)
        rowless = JobFactory(expired=True, lease_owner="worker-gone")
        registered(None)
        protocol.reap(cur)
        assert (row(unlisted_owner).isolated, row(unlisted_owner).attempt) == (True, 1)
        assert (row(rowless).isolated, row(rowless).attempt) == (True, 1)

    def test_an_unlisted_job_out_of_attempts_is_not_dead(self, cur):
        job = JobFactory(expired=True, attempt=3, max_attempts=3)
        registered([])
        protocol.reap(cur)
        after = row(job)
        assert (after.state, after.attempt, after.finished_at) == ("available", 2, None)

    def test_an_isolated_job_never_started_stays_isolated(self, cur):
        job = JobFactory(expired=True, isolated=True)
        registered([])
        protocol.reap(cur)
        assert (row(job).state, row(job).isolated, row(job).attempt) == ("available", True, 0)

    def test_giving_attempts_back_stops_after_max_attempts(self, cur):
        """A worker that dies before it lists anything (while fetching a claim) must not loop."""
        given_back = [{**UNSTARTED, "attempt": 1}] * 3
        job = JobFactory(expired=True, attempt=1, max_attempts=3, errors=given_back)
        registered([])
        [reaped] = protocol.reap(cur)
        assert reaped.started is True  # Counted as started now: charged, and isolated.
        assert (row(job).state, row(job).isolated, row(job).attempt) == ("available", True, 1)

    def test_a_cancel_request_still_cancels_an_unstarted_job(self, cur):
        job = JobFactory(expired=True, cancel_requested_at=timezone.now(), cancel_requested_by="op")
        registered([])
        protocol.reap(cur)
        after = row(job)
        assert (after.state, after.isolated, after.attempt) == ("cancelled", False, 0)
        assert after.errors[-1]["exception_class_path"] == "django_conveyor.exceptions.Cancelled"


@pytest.mark.django_db
class TestDeclareStarts:
    def test_lists_the_jobs_and_returns_the_leases_still_held(self, cur):
        mine, taken = JobFactory(running=True), JobFactory(running=True)
        registered(None)
        Job.objects.filter(pk=taken.id).update(lease_version=2, lease_owner="worker-b")
        held = protocol.declare_starts(
            cur, owner=OWNER, may_start=[mine.id, taken.id], check=[(mine.id, 1), (taken.id, 1)]
        )
        assert held == {mine.id}
        assert Worker.objects.get(pk=OWNER).may_start == [mine.id, taken.id]

    def test_none_lists_nothing_in_particular(self, cur):
        registered([1, 2])
        assert protocol.declare_starts(cur, owner=OWNER, may_start=None, check=[]) == set()
        assert Worker.objects.get(pk=OWNER).may_start is None

    def test_an_empty_list_is_kept_as_one(self, cur):
        registered(None)
        protocol.declare_starts(cur, owner=OWNER, may_start=[], check=[])
        assert Worker.objects.get(pk=OWNER).may_start == []


JOBS = 1500  # More than the start window (claims.MAX_START_WINDOW) and the slots.


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_killed_worker_with_a_deep_buffer_isolates_only_what_it_could_start(procs, tmp_path, cur):
    """A real worker claims 1,500 jobs ahead, starts a few, and is killed: every job a
    handler started is isolated, and the jobs it never listed go back as they were."""
    results = tasks.started_then_sleeps.enqueue_many([((f"j{i}", 0.5), {}) for i in range(JOBS)])
    labels = {f"j{i}": int(result.id) for i, result in enumerate(results)}
    proc = start_logged_worker(
        procs, tmp_path, "deep", "--concurrency", "2", "--prefetch", "4000", "--lease", "2"
    )
    wait_until(lambda: Effect.objects.count() >= 4, timeout=60)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    started = {labels[label] for label in Effect.objects.values_list("label", flat=True)}
    wait_until(
        lambda: not Job.objects.filter(state="running", lease_expires_at__gte=timezone.now()),
        timeout=30,
    )
    reaped = protocol.reap(cur, limit=JOBS)
    assert len(reaped) == JOBS - Job.objects.filter(state="completed").count()
    isolated = set(Job.objects.filter(isolated=True).values_list("id", flat=True))
    assert started - set(Job.objects.filter(state="completed").values_list("id", flat=True)) <= (
        isolated
    )  # Every started job that did not finish may have killed it: isolated.
    back = Job.objects.filter(state="available", isolated=False)
    assert back.count() >= JOBS - 2 - MAX_START_WINDOW  # Only the slots and the window.
    assert set(back.values_list("attempt", flat=True)) == {0}  # Their attempt given back.
    assert not started & set(back.values_list("id", flat=True))


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_worker_drains_through_its_unlisted_buffer(procs, tmp_path):
    """6,000 no-op jobs, 2 slots, --prefetch 4000: most of the buffer waits unlisted
    and moves to the slots a window at a time; every job completes once, none isolated,
    and the worker's list is NULL again once nothing waits unlisted."""
    ids = [int(result.id) for result in tasks.noop.enqueue_many([((), {})] * 6000)]
    proc = start_logged_worker(
        procs, tmp_path, "drain", "--burst", "--concurrency", "2", "--prefetch", "4000"
    )
    assert proc.wait(120) == 0
    rows = Job.objects.filter(pk__in=ids)
    assert rows.filter(state="completed", attempt=1, isolated=False).count() == 6000
    log = (tmp_path / "drain.log").read_text()
    assert "Traceback" not in log and "control loop error" not in log
    assert list(Worker.objects.values_list("may_start", flat=True)) == [None]


def buffered(job_id: int) -> Attempt:
    now = timezone.now()
    lease = protocol.Lease(
        id=job_id, task_path="t", args=[], kwargs={}, queue="default", backend="default",
        priority=0, attempt=1, max_attempts=3, version=1, idempotency_key=None,
        enqueued_at=now, started_at=now, owner=OWNER, pickup_delay=0.0, errors=None,
        isolated=False, enqueued_run_after=None, tags=None, meta=None,
    )  # fmt: skip
    return Attempt(lease=lease, database="default")


class TestTheReserve:
    def window(self, *attempts: Attempt) -> StartWindow:
        window = StartWindow(OWNER)
        window.reserve.update((a.lease.id, a) for a in attempts)
        return window

    def test_its_front_skips_and_drops_lost_attempts_and_keeps_the_rest(self):
        first, lost, second, third, later_lost = (buffered(i) for i in range(1, 6))
        lost.mark_lost("reaped")
        later_lost.mark_lost("reaped")
        window = self.window(first, lost, second, third, later_lost)
        assert window.front(2) == [first, second]
        # Only the front was read: a lost attempt further back waits its turn.
        assert list(window.reserve) == [1, 3, 4, 5]
        assert window.front(10) == [first, second, third]
        assert list(window.reserve) == [1, 3, 4]

    def test_it_moves_only_with_room_for_half_a_window(self):
        window = self.window(buffered(1))
        assert window.moving(room=4, window=8) and not window.moving(room=3, window=8)
        assert window.moving(room=1, window=1) and not window.moving(room=0, window=1)
        assert not StartWindow(OWNER).moving(room=100, window=8)  # Nothing waits.


@pytest.mark.django_db
@pytest.mark.parametrize("lists", [False, True])
def test_a_failed_cycle_makes_the_list_unsure_only_if_it_may_have_written_it(lists):
    """A cycle that wrote no list leaves what the row holds known; one that may have
    written it (and did not commit) makes the worker write it again before trusting it."""
    worker = WorkerLoop(WorkerOptions(queues=("default",), listen=False, stop_signals=()))
    assert worker.starts.unsure is False
    cycle = Cycle(
        batch={}, steps=[], now=0.0, room=0, window=0, statements=1, lists=lists,
        pipelined=False,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="the connection broke"):
        worker.finish(cycle, RuntimeError("the connection broke"))
    assert worker.starts.unsure is lists
