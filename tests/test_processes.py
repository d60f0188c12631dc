"""Real worker processes: draining, kill -9, SIGSTOP zombies, shutdown, supervision."""

import datetime as dt
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db.models import Count

from django_conveyor.management.commands.conveyor_worker import COLLECT_AFTER_ALLOCATIONS
from django_conveyor.models import Job, LedgerEntry
from django_conveyor.worker.shutdown import REPEAT_GRACE_SECONDS
from tests.helpers import REPO, stop_process, wait_until, worker_env
from tests.helpers import start_logged_worker as worker
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def states() -> dict[str, int]:
    return dict(Job.objects.values_list("state").annotate(n=Count("id")))


@pytest.mark.parametrize("processes", ["1", "2"])
def test_the_worker_process_freezes_what_it_loaded_and_collects_less_often(
    procs, tmp_path, processes
):
    results = tasks.collector_state.enqueue_many([((), {})] * 4)
    proc = worker(procs, tmp_path, "gc", "--processes", processes, "--burst")
    assert proc.wait(120) == 0, (tmp_path / "gc.log").read_text()[-3000:]
    for result in results:
        result.refresh()
        state = result.return_value
        assert state["threshold"][0] == COLLECT_AFTER_ALLOCATIONS != gc.get_threshold()[0]
        assert state["threshold"][1:] == list(gc.get_threshold()[1:])  # Left as Python sets them.
        assert state["frozen"] > 10_000  # Django, the apps, the settings.


def test_four_processes_drain_400_jobs_each_effect_once(procs, tmp_path):
    tasks.apply_once.enqueue_many([((f"e{i}",), {}) for i in range(400)])
    proc = worker(procs, tmp_path, "drain", "--processes", "4", "--concurrency", "4", "--burst")
    assert proc.wait(120) == 0, (tmp_path / "drain.log").read_text()[-3000:]
    assert states() == {"completed": 400}
    assert Effect.objects.count() == 400
    assert Effect.objects.values("job_id").distinct().count() == 400
    assert LedgerEntry.objects.count() == 400
    # Every effect was written under the token that completed its job.
    tokens = dict(Job.objects.values_list("id", "lease_version"))
    assert all(tokens[e.job_id] == e.token for e in Effect.objects.all())
    owners = set(Job.objects.values_list("lease_owner", flat=True))
    assert len({o.split(":")[1] for o in owners}) > 1  # more than one process took work


def test_kill9_mid_job_is_reaped_and_completes_on_attempt_2(procs, tmp_path):
    result = tasks.slow_apply_once.enqueue("k", 2.0)
    first = worker(procs, tmp_path, "first", "--lease", "1")
    wait_until(lambda: Job.objects.get(pk=result.id).state == "running")
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    assert Effect.objects.count() == 0  # it died before its effect
    worker(procs, tmp_path, "second", "--lease", "5")
    wait_until(lambda: Job.objects.get(pk=result.id).state == "completed", timeout=30)
    row = Job.objects.get(pk=result.id)
    assert row.attempt == 2
    assert row.errors[0]["exception_class_path"] == "django_conveyor.exceptions.LeaseLost"
    assert Effect.objects.filter(job_id=row.id).count() == 1
    assert Effect.objects.get(job_id=row.id).token == row.lease_version == 2


def test_sigstop_zombie_cannot_complete_or_apply_its_effect(procs, tmp_path):
    result = tasks.slow_apply_once.enqueue("z", 1.5)
    zombie = worker(procs, tmp_path, "zombie", "--lease", "1")
    wait_until(lambda: Job.objects.get(pk=result.id).state == "running")
    zombie_owner = Job.objects.get(pk=result.id).lease_owner
    os.kill(zombie.pid, signal.SIGSTOP)
    rescuer = worker(procs, tmp_path, "rescuer", "--lease", "10")
    # Completed by the guarded commit; its return value is stored just after.
    wait_until(lambda: Job.objects.get(pk=result.id).return_value is not None, timeout=30)
    done = Job.objects.get(pk=result.id)
    assert done.lease_owner != zombie_owner
    os.kill(zombie.pid, signal.SIGCONT)
    time.sleep(2.5)  # the zombie's handler wakes, tries its guarded commit, is refused
    assert stop_process(zombie) == 0
    assert stop_process(rescuer) == 0
    after = Job.objects.get(pk=result.id)
    assert (after.state, after.lease_owner, after.lease_version) == (
        "completed",
        done.lease_owner,
        done.lease_version,
    )
    assert after.return_value == done.return_value
    assert Effect.objects.filter(job_id=after.id).count() == 1
    assert Effect.objects.get(job_id=after.id).token == after.lease_version
    assert LedgerEntry.objects.filter(job_id=after.id).count() == 1
    log = (tmp_path / "zombie.log").read_text()
    assert "'stale_outcomes': 1" in log or "'leases_lost': 1" in log, log[-2000:]


def test_worker_frozen_inside_atomic_loses_the_job_within_lease_and_bound(procs, tmp_path):
    """SIGSTOP inside context.atomic(), holding the row lock REAP skips, never continued.

    The guarded transaction is bounded by the lease (1 s here): PostgreSQL ends
    it, the job is reaped and completed by another worker, and the frozen
    worker's effect never commits, even after SIGCONT.
    """
    lease, reap = 1.0, 0.5  # --lease, and REAP_SECONDS of tests/settings.py
    # A reaper that serves another queue: REAP takes expired leases of every queue.
    worker(procs, tmp_path, "reaper", "--queues", "emails")
    marker = tmp_path / "inside"
    result = tasks.dwell_in_atomic.enqueue("f", str(marker), 6.0)
    zombie = worker(procs, tmp_path, "zombie", "--lease", str(lease))
    wait_until(marker.exists, timeout=30)
    os.kill(zombie.pid, signal.SIGSTOP)
    frozen = Job.objects.get(pk=result.id)
    assert (frozen.state, frozen.attempt) == ("running", 1)
    reaped = wait_until(
        lambda: (job := Job.objects.get(pk=result.id)).state != "running" and job, timeout=30
    )
    # Reaped one lease and one bound after the freeze at most (plus the reaper's
    # interval and scheduling slack), not when the frozen worker comes back.
    [lost] = reaped.errors
    assert lost["exception_class_path"] == "django_conveyor.exceptions.LeaseLost"
    taken = dt.datetime.fromisoformat(lost["time"]) - dt.datetime.fromtimestamp(
        marker.stat().st_mtime, dt.UTC
    )
    assert taken.total_seconds() < lease + lease + reap + 5.0
    rescuer = worker(procs, tmp_path, "rescuer", "--lease", "10")
    wait_until(lambda: Job.objects.get(pk=result.id).return_value is not None, timeout=30)
    done = Job.objects.get(pk=result.id)
    assert (done.state, done.attempt) == ("completed", 2)
    assert done.lease_owner != frozen.lease_owner
    os.kill(zombie.pid, signal.SIGCONT)
    log = tmp_path / "zombie.log"
    # Its handler wakes inside the ended transaction (PostgreSQL closed the
    # session: IdleInTransactionSessionTimeout), its commit fails, and its
    # outcome is refused by the fence.
    wait_until(lambda: "stale outcome" in log.read_text(), timeout=30)
    assert stop_process(zombie) == 0
    assert stop_process(rescuer) == 0
    after = Job.objects.get(pk=result.id)
    assert (after.state, after.lease_version) == ("completed", done.lease_version)
    assert list(Effect.objects.filter(job_id=after.id).values_list("token", flat=True)) == [2]
    assert list(
        LedgerEntry.objects.filter(job_id=after.id).values_list("lease_version", flat=True)
    ) == [2]


def test_graceful_shutdown_hands_back_leases_at_once(procs, tmp_path):
    results = [tasks.sleeper.enqueue(30) for _ in range(6)]
    proc = worker(
        procs,
        tmp_path,
        "w",
        "--concurrency",
        "2",
        "--prefetch",
        "2",
        "--shutdown-timeout",
        "0.5",
        "--lease",
        "60",
    )
    wait_until(lambda: Job.objects.filter(state="running").count() == 4)
    started = time.monotonic()
    assert stop_process(proc, signal.SIGTERM) == 0
    assert time.monotonic() - started < 10
    rows = Job.objects.filter(pk__in=[r.id for r in results])
    assert {r.state for r in rows} == {"available"}
    assert {r.attempt for r in rows} == {0}  # a hand-back does not use an attempt
    assert all(r.lease_expires_at is None and r.errors == [] for r in rows)


def test_shutdown_lets_in_flight_jobs_finish(procs, tmp_path):
    result = tasks.started_then_sleeps.enqueue("finish", 1.0)
    proc = worker(procs, tmp_path, "w", "--shutdown-timeout", "20")
    # Claimed is not yet started (a job still buffered is handed back): wait for its slot.
    wait_until(lambda: Effect.objects.filter(label="finish").exists())
    assert stop_process(proc, signal.SIGINT) == 0
    assert Job.objects.get(pk=result.id).state == "completed"


def test_second_signal_after_the_grace_interval_exits_at_once(procs, tmp_path):
    tasks.sleeper.enqueue(30)
    proc = worker(procs, tmp_path, "w", "--shutdown-timeout", "60", "--concurrency", "1")
    wait_until(lambda: Job.objects.filter(state="running").exists())
    os.kill(proc.pid, signal.SIGTERM)
    wait_until(lambda: "SIGTERM received" in (tmp_path / "w.log").read_text())
    time.sleep(REPEAT_GRACE_SECONDS + 0.1)  # The first stop was noted before its log line.
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == 128 + signal.SIGTERM
    assert Job.objects.get().state == "running"  # left for the reaper


def test_supervisor_restarts_a_dead_process(procs, tmp_path):
    proc = worker(procs, tmp_path, "sup", "--processes", "2")
    children = wait_until(lambda: child_pids(proc.pid) if len(child_pids(proc.pid)) == 2 else None)
    os.kill(children[0], signal.SIGKILL)
    replaced = wait_until(
        lambda: (c := child_pids(proc.pid)) and len(c) == 2 and children[0] not in c and c
    )
    assert children[1] in replaced
    result = tasks.add.enqueue(2, 2)
    wait_until(lambda: Job.objects.get(pk=result.id).state == "completed")
    assert stop_process(proc) == 0


def child_pids(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--concurrency", "0"], 2, "--concurrency: must be 1 or more, got 0"),
        (["--concurrency", "100000"], 2, "--concurrency: must be at most 1024, got 100000"),
        (["--lease", "soon"], 2, "--lease: expected a number of seconds, got 'soon'"),
        (["--lease", "inf"], 2, "--lease: must be at most 315360000 seconds (ten years), got inf"),
        (["--lease", "1e300"], 2, "--lease: must be at most 315360000 seconds (ten years)"),
        (["--shutdown-timeout", "nan"], 2, "--shutdown-timeout: expected a number of seconds"),
        (["--interval=-inf"], 2, "--interval/--poll: must be zero or more seconds, got -inf"),
        (
            ["--prefetch", "99999999999", "--queues", "default"],
            1,
            "prefetch must be a whole number from 0 to 2147483647",
        ),
        (["--queues", "nope"], 1, "Unknown queue(s) nope"),
    ],
)
def test_bad_flags_are_named(args, code, message):
    proc = subprocess.run(
        [sys.executable, "-m", "django", "conveyor_worker", *args],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == code
    assert message in proc.stderr


@pytest.mark.parametrize(
    ("conveyor", "message"),
    [
        ('{"LEASE_SECONDS": NaN}', "CONVEYOR['LEASE_SECONDS'] must be a number, not nan."),
        (
            '{"POLL_SECONDS": Infinity}',
            "CONVEYOR['POLL_SECONDS'] must be at most 315360000 seconds (ten years), not inf.",
        ),
        ('{"MAX_ATTEMPTS": 1e20}', "CONVEYOR['MAX_ATTEMPTS'] must be int, not float"),
    ],
)
@pytest.mark.parametrize("skip_checks", [False, True], ids=["checks", "--skip-checks"])
def test_bad_numeric_settings_stop_the_worker_at_start(conveyor, message, skip_checks):
    proc = subprocess.run(
        [sys.executable, "-m", "django", "conveyor_worker", "--burst", "--queues", "default",
         *(["--skip-checks"] if skip_checks else [])],
        cwd=REPO, env={**worker_env(), "CONVEYOR_TEST_CONVEYOR_JSON": conveyor},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_burst_exits_zero_when_nothing_is_ready(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "django", "conveyor_worker", "--burst", "--queues", "default"],
        cwd=REPO, env=worker_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0
