"""Stop signals with real processes: each way a stop reaches a worker, and the hard stop.

A signal to the whole process group (systemd's control group, supervisord's
stopasgroup, `kill -TERM -<pgid>`, Ctrl-C) reaches every child of
`--processes` twice: once from the sender, once from the supervisor. That
must stay one graceful stop: exit 0, unfinished jobs handed back at once.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from django_conveyor.models import Job
from django_conveyor.worker.shutdown import REPEAT_GRACE_SECONDS
from tests.helpers import start_logged_worker as worker
from tests.helpers import stop_wait_seconds, wait_until
from tests.test_processes import child_pids, states
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HANDED_BACK = ("--shutdown-timeout", "0.5", "--lease", "60", "--prefetch", "1")
HARD = ("--shutdown-timeout", "120", "--lease", "60", "--prefetch", "0")  # Every claim runs.


def running(n: int) -> bool:
    return Job.objects.filter(state="running").count() == n


def log_says(tmp_path, name: str, text: str) -> bool:
    return text in (tmp_path / f"{name}.log").read_text()


def assert_handed_back(ids: list[int]) -> None:
    """Every job is available again, at once: no lease left to expire, no attempt used."""
    rows = list(Job.objects.filter(pk__in=ids))
    assert {r.state for r in rows} == {"available"}
    assert all(r.lease_owner is None and r.lease_expires_at is None for r in rows)
    assert all(r.errors == [] for r in rows)  # Handed back, not reaped.


def exit_code(proc, tmp_path, name: str, timeout: float | None = None) -> int:
    """The process's exit status; a process still running fails with its log."""
    timeout = stop_wait_seconds() if timeout is None else timeout
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log = (tmp_path / f"{name}.log").read_text()
        raise AssertionError(f"{name} still runs after {timeout}s:\n{log[-6000:]}") from None


def sleepers(n: int) -> list[int]:
    return [int(tasks.sleeper.enqueue(60).id) for _ in range(n)]


def started_sleepers(n: int) -> None:
    """n jobs that a hard stop must leave running: each records when its handler starts.

    A claimed job counts as running before a slot starts its handler, and a
    stop hands back the jobs not started yet; so a test of what a hard stop
    leaves waits for the handlers themselves, not only for the claims.
    """
    for _ in range(n):
        tasks.started_then_sleeps.enqueue("hard", 60)


def handlers_started(n: int) -> bool:
    return Effect.objects.filter(label="hard").count() == n and running(n)


def supervised(procs, tmp_path, name: str, *args: str):
    return worker(procs, tmp_path, name, "--processes", "2", "--concurrency", "2", *args)


@pytest.mark.parametrize(
    ("target", "sig"),
    [("supervisor", signal.SIGTERM), ("group", signal.SIGTERM), ("group", signal.SIGINT)],
    ids=["sigterm-to-supervisor", "sigterm-to-group", "ctrl-c-to-group"],
)
def test_one_stop_signal_is_a_graceful_stop(procs, tmp_path, target, sig):
    ids = sleepers(8)
    proc = supervised(procs, tmp_path, "sup", *HANDED_BACK)
    wait_until(lambda: running(6))  # Two slots and a buffered job in each child.
    if target == "group":
        os.killpg(proc.pid, sig)  # The worker leads its own process group.
    else:
        os.kill(proc.pid, sig)
    assert exit_code(proc, tmp_path, "sup", 30) == 0
    assert_handed_back(ids)


def test_group_sigterm_during_a_drain_of_400_jobs_exits_zero(procs, tmp_path):
    ids = [int(r.id) for r in tasks.apply_once.enqueue_many([((f"e{i}",), {}) for i in range(400)])]
    proc = worker(procs, tmp_path, "drain", "--processes", "4", "--concurrency", "4")
    wait_until(lambda: Job.objects.filter(state="completed").exists())
    os.killpg(proc.pid, signal.SIGTERM)
    assert exit_code(proc, tmp_path, "drain", 60) == 0
    counts = states()
    assert set(counts) <= {"completed", "available"}, counts
    assert sum(counts.values()) == 400
    done = set(Job.objects.filter(state="completed").values_list("id", flat=True))
    assert Effect.objects.count() == len(done)  # Each completed job's effect once ...
    assert set(Effect.objects.values_list("job_id", flat=True)) == done  # ... and no other.
    left = [i for i in ids if i not in done]
    if left:
        assert_handed_back(left)


def test_group_sigterm_while_children_start_is_still_graceful(procs, tmp_path):
    proc = supervised(procs, tmp_path, "early")
    # The children exist but are still setting up: the stop waits for their handlers.
    wait_until(lambda: len(child_pids(proc.pid)) == 2, interval=0.005)
    os.killpg(proc.pid, signal.SIGTERM)
    assert exit_code(proc, tmp_path, "early", 60) == 0


def test_a_stop_while_the_supervisor_still_forks_stops_every_child(procs, tmp_path):
    proc = worker(procs, tmp_path, "forking", "--processes", "4", "--concurrency", "1")
    # The first child exists; the others may still be forked after the stop.
    wait_until(lambda: child_pids(proc.pid), interval=0.001)
    os.kill(proc.pid, signal.SIGTERM)
    assert exit_code(proc, tmp_path, "forking", 60) == 0


def test_sigterm_to_one_child_hands_back_its_jobs_and_replaces_it(procs, tmp_path):
    ids = sleepers(6)
    proc = supervised(procs, tmp_path, "sup", *HANDED_BACK)
    wait_until(lambda: running(6))
    first, second = child_pids(proc.pid)
    owners = set(Job.objects.filter(state="running").values_list("lease_owner", flat=True))
    (gone,) = [o for o in owners if o.split(":")[1] == str(first)]
    os.kill(first, signal.SIGTERM)
    wait_until(lambda: (c := child_pids(proc.pid)) and len(c) == 2 and first not in c)
    assert second in child_pids(proc.pid)
    wait_until(lambda: log_says(tmp_path, "sup", f"worker process {first} stopped (exit 0)"))
    assert not Job.objects.filter(lease_owner=gone).exists()  # Handed back, not left to expire.
    assert proc.poll() is None  # The supervisor carries on ...
    os.kill(proc.pid, signal.SIGTERM)
    assert exit_code(proc, tmp_path, "sup") == 0  # ... until it is stopped itself.
    assert_handed_back(ids)


def test_stop_signal_repeated_after_the_grace_interval_is_a_hard_stop(procs, tmp_path):
    started_sleepers(4)
    proc = supervised(procs, tmp_path, "sup", *HARD)
    wait_until(lambda: handlers_started(4))
    os.kill(proc.pid, signal.SIGTERM)
    wait_until(lambda: log_says(tmp_path, "sup", "SIGTERM received: stopping 2"))
    time.sleep(REPEAT_GRACE_SECONDS + 0.1)  # The supervisor noted the first stop before its log.
    os.kill(proc.pid, signal.SIGTERM)
    assert exit_code(proc, tmp_path, "sup") == 128 + signal.SIGTERM
    assert running(4)  # Nothing handed back: the leases expire and are reaped.


def test_sigquit_to_the_group_is_a_hard_stop(procs, tmp_path):
    started_sleepers(4)
    proc = supervised(procs, tmp_path, "sup", *HARD)
    wait_until(lambda: handlers_started(4))
    os.killpg(proc.pid, signal.SIGQUIT)
    assert exit_code(proc, tmp_path, "sup") == 128 + signal.SIGQUIT
    assert running(4)


def test_a_single_worker_takes_a_quick_repeat_as_the_same_stop(procs, tmp_path):
    ids = sleepers(3)
    proc = worker(procs, tmp_path, "w", "--concurrency", "2", *HANDED_BACK)
    wait_until(lambda: running(3))
    os.kill(proc.pid, signal.SIGTERM)  # As a terminal's Ctrl-C plus a process manager's
    os.kill(proc.pid, signal.SIGINT)  # forwarded SIGTERM would arrive.
    assert exit_code(proc, tmp_path, "w", 30) == 0
    assert_handed_back(ids)


def test_sigquit_stops_a_single_worker_at_once(procs, tmp_path):
    sleepers(1)
    proc = worker(procs, tmp_path, "w", "--shutdown-timeout", "120", "--concurrency", "1")
    wait_until(lambda: running(1))
    os.kill(proc.pid, signal.SIGQUIT)
    assert exit_code(proc, tmp_path, "w") == 128 + signal.SIGQUIT
    assert running(1)


LOCK_HELD = """
import os, signal, sys, threading
sys.path.insert(0, os.getcwd())
import django
django.setup()
from django_conveyor.worker.loop import Worker
from django_conveyor.worker.config import WorkerOptions

worker = Worker(WorkerOptions(queues=("default",), listen=False))
worker.signals.install()
# The main thread holds the wake event's lock, as it does for a few bytecodes
# inside every wake.wait() and wake.clear(): the stop signal lands right then.
with worker.wake._cond:
    signal.raise_signal(signal.SIGTERM)
    print("the handler returned", flush=True)
print("stopping:", worker.stopping.wait(10), flush=True)
"""


def test_a_stop_signal_landing_while_the_loop_holds_its_wake_lock_still_stops(tmp_path):
    """The flaky zombie test's cause (issue 21): the handler took a lock its own thread held."""
    from tests.helpers import REPO, worker_env

    proc = subprocess.Popen(
        [sys.executable, "-c", LOCK_HELD], cwd=REPO, env=worker_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the signal handler deadlocked:\n{out[-3000:]}") from None
    assert proc.returncode == 0, out
    assert "the handler returned" in out and "stopping: True" in out, out
