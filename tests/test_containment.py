"""Real worker processes against hostile handlers (issue 8, items 2 and 3).

A handler that kills its process must not take the jobs claimed with it
down again and again; a handler that ignores its timeout, sync or async,
must not keep a worker alive past its shutdown timeout, or keep `--burst`
from finishing.
"""

import os
import signal
import time

import pytest
from django.db.models import Count
from django.utils import timezone

from django_conveyor.models import Job
from django_conveyor.worker.connections import connect
from tests.factories import JobFactory
from tests.helpers import start_logged_worker as worker
from tests.helpers import stop_process, wait_until
from tests.testapp import hostile, tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MARGIN_SECONDS = 5.0  # Exit after the shutdown timeout: logging, hand-back, a busy machine.
LOST = "django_conveyor.exceptions.LeaseLost"


def unfinished() -> int:
    return Job.objects.exclude(state__in=["completed", "dead", "failed", "cancelled"]).count()


def live_leases() -> int:
    return Job.objects.filter(state="running", lease_expires_at__gte=timezone.now()).count()


def test_a_crasher_dies_alone_and_its_batch_mates_complete(procs, tmp_path):
    crasher = hostile.kills_its_worker.enqueue()  # First in claim order: in the first batch.
    mates = [tasks.apply_once.enqueue(f"mate-{i}") for i in range(20)]
    codes = []
    for run in range(15):
        if not unfinished():
            break
        wait_until(lambda: not live_leases(), timeout=30)  # The dead worker's leases expire.
        # Claim-ahead on (adaptive, the default): the first claim takes 8 jobs.
        proc = worker(procs, tmp_path, f"run{run}", "--burst", "--concurrency", "4", "--lease", "1")
        codes.append(proc.wait(60))
    assert not unfinished(), codes
    assert codes.count(1) == 3, codes  # It killed a worker once per attempt, no more.
    assert set(codes) <= {0, 1}
    row = Job.objects.get(pk=crasher.id)
    assert (row.state, row.attempt) == ("dead", 3)
    assert [e["exception_class_path"] for e in row.errors] == [LOST] * 3
    rows = Job.objects.filter(pk__in=[m.id for m in mates])
    assert {r.state for r in rows} == {"completed"}
    # Each mate died at most once with a crasher beside it; isolated, it ran alone.
    assert max(r.attempt for r in rows) <= 2
    effects = dict(Effect.objects.values_list("job_id").annotate(n=Count("id")))
    assert effects == {int(m.id): 1 for m in mates}  # Every mate's effect exactly once.


STUCK = {
    "sleep": lambda: hostile.ignores_shutdown.enqueue(False),
    "busy": lambda: hostile.ignores_shutdown.enqueue(True),
    "async": lambda: hostile.async_ignores_shutdown.enqueue(),
}


@pytest.mark.parametrize(
    ("kind", "sig", "processes"),
    [
        ("sleep", signal.SIGTERM, "1"),
        ("busy", signal.SIGTERM, "1"),
        ("async", signal.SIGTERM, "1"),
        ("async", signal.SIGINT, "1"),
        ("async", signal.SIGTERM, "2"),  # The supervisor's children end as quickly.
    ],
)
def test_the_first_signal_ends_a_worker_whose_handler_ignores_it(
    procs, tmp_path, kind, sig, processes
):
    job = STUCK[kind]()
    proc = worker(
        procs, tmp_path, "w", "--concurrency", "2", "--shutdown-timeout", "1",
        "--processes", processes,
    )  # fmt: skip
    wait_until(lambda: Effect.objects.filter(label="stuck").exists())  # A slot runs it.
    sent = time.monotonic()
    os.kill(proc.pid, sig)
    code = proc.wait(1 + MARGIN_SECONDS + 30)
    elapsed = time.monotonic() - sent
    log = (tmp_path / "w.log").read_text()
    assert code == 0, log[-3000:]
    assert elapsed < 1 + MARGIN_SECONDS, (elapsed, log[-3000:])
    row = Job.objects.get(pk=job.id)
    # Handed back at the shutdown timeout: available at once, the attempt not counted.
    assert (row.state, row.attempt, row.lease_owner, row.errors) == ("available", 0, None, [])
    assert "exiting without them" in log


TIMED_OUT = {
    "sleep": lambda: hostile.ignores_timeout.enqueue(False),
    "busy": lambda: hostile.ignores_timeout.enqueue(True),
    "async": lambda: hostile.async_ignores_timeout.enqueue(),
}


@pytest.mark.parametrize("kind", sorted(TIMED_OUT))
def test_burst_finishes_beside_a_stuck_timed_out_handler(procs, tmp_path, kind):
    job = TIMED_OUT[kind]()
    others = [tasks.add.enqueue(i, i) for i in range(5)]
    started = time.monotonic()
    # One slot: the others run only because a new thread takes the stuck one's slot.
    proc = worker(procs, tmp_path, "w", "--burst", "--concurrency", "1")
    code = proc.wait(60)
    elapsed = time.monotonic() - started
    log = (tmp_path / "w.log").read_text()
    assert code == 0, log[-3000:]
    assert elapsed < 1 + 15, (elapsed, log[-3000:])  # Start-up, the 1 s timeout, the rest.
    row = Job.objects.get(pk=job.id)
    assert (row.state, row.errors[-1]["exception_class_path"]) == ("dead", "builtins.TimeoutError")
    assert {r.state for r in Job.objects.filter(pk__in=[o.id for o in others])} == {"completed"}


def test_a_row_locked_by_another_transaction_is_not_a_lost_lease(procs, tmp_path):
    """HEARTBEAT skips locked rows; a concurrent claim's lock must not cost the lease."""
    locked, other = tasks.sleeper.enqueue(6), tasks.sleeper.enqueue(6)
    proc = worker(procs, tmp_path, "w", "--concurrency", "2", "--lease", "3")
    wait_until(lambda: Job.objects.filter(state="running").count() == 2)

    def expiry() -> object:
        return Job.objects.get(pk=other.id).lease_expires_at

    with connect("default") as claimer, claimer.transaction():
        # What a CLAIM leaves on a row it looked at and let go, until it commits.
        claimer.execute("SELECT 1 FROM conveyor_job WHERE id = %s FOR UPDATE", [locked.id])
        before = expiry()
        wait_until(lambda: expiry() > before)  # A heartbeat ran while the row was locked.
    wait_until(lambda: Job.objects.filter(state="completed").count() == 2, timeout=30)
    assert stop_process(proc) == 0
    row = Job.objects.get(pk=locked.id)
    # The handler was never told its lease was gone (sleeper returns lease_held()).
    assert (row.attempt, row.return_value, row.errors) == (1, True, [])
    assert "lease lost" not in (tmp_path / "w.log").read_text()


def test_a_burst_worker_runs_every_isolated_job_before_it_exits(procs, tmp_path):
    """Jobs a crash left isolated each run alone, short ones back to back; a burst
    worker runs all of them, and the ordinary ones beside, before it exits (it once
    left the rest when the pass that settled one isolated job had not looked for
    the next)."""
    isolated = JobFactory.create_batch(60, isolated=True)
    ordinary = JobFactory.create_batch(60)
    proc = worker(procs, tmp_path, "isolated", "--burst", "--concurrency", "4")
    assert proc.wait(120) == 0
    ids = [job.id for job in isolated + ordinary]
    rows = Job.objects.filter(pk__in=ids)
    assert rows.filter(state="completed", attempt=1).count() == 120
    assert not rows.filter(isolated=True).exists()  # Their COMPLETE cleared the mark.
