"""Periodic jobs with real workers: exactly one job per tick, across restarts."""

import os
import signal
from datetime import timedelta

import pytest

from django_conveyor.models import Cron, Job
from django_conveyor.periodic import ticks
from tests.factories import CronFactory
from tests.helpers import start_logged_worker as worker
from tests.helpers import stop_process, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PREFIX = "cron:every-second:"


def tick_instants() -> list:
    jobs = Job.objects.filter(idempotency_key__startswith=PREFIX)
    return sorted(jobs.values_list("run_after", flat=True))


def test_three_workers_one_job_per_second_none_missing_across_a_kill(procs, tmp_path):
    from django.db import connection

    with connection.cursor() as cursor:
        now = ticks.database_now(cursor)
    cron = CronFactory(name="every-second", schedule="* * * * * *", created=now)
    for n in range(3):
        worker(procs, tmp_path, f"w{n}")
    wait_until(lambda: len(tick_instants()) >= 5, timeout=60)
    os.kill(procs[0].pid, signal.SIGKILL)  # a scheduler dies mid-stream...
    worker(procs, tmp_path, "w3")  # ...and a new one starts
    first = tick_instants()[0]
    assert first == cron.next_tick_at  # none missing from the schedule's first tick on
    wait_until(
        lambda: tick_instants() and tick_instants()[-1] - first >= timedelta(seconds=10), timeout=60
    )
    Cron.objects.filter(pk=cron.pk).update(enabled=False)
    for proc in procs[1:]:
        assert stop_process(proc) == 0
    seen = tick_instants()
    keys = Job.objects.filter(idempotency_key__startswith=PREFIX)
    assert keys.count() == len(set(keys.values_list("idempotency_key", flat=True)))
    # Every second from the first tick to the last, once each.
    assert seen == [first + timedelta(seconds=s) for s in range(len(seen))]
    assert len(seen) >= 11
    done = set(keys.values_list("state", flat=True))
    assert done <= {"completed", "available", "running"}
    assert Job.objects.filter(idempotency_key__startswith=PREFIX, state="completed").count() >= 10


def test_no_cron_workers_enqueue_no_ticks(procs, tmp_path):
    from django.db import connection

    with connection.cursor() as cursor:
        now = ticks.database_now(cursor)
    CronFactory(name="every-second", schedule="* * * * * *", created=now)
    proc = worker(procs, tmp_path, "nocron", "--no-cron")
    wait_until(lambda: "starting" in (tmp_path / "nocron.log").read_text(), timeout=30)
    later = now + timedelta(seconds=3)
    wait_until(lambda: ticks.database_now(connection.cursor()) > later, timeout=30)
    assert stop_process(proc) == 0
    assert tick_instants() == []
