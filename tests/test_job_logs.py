"""Per-attempt logs (docs/observability.md#per-attempt-logs): kept with their attempt only.

Real worker processes run handlers in concurrent slots, sync and async,
each logging lines that name its own job while other threads log too; each
job's log must hold its own lines and nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.db import connection

from django_conveyor import protocol
from django_conveyor.models import Job, JobLog
from tests.factories import JobFactory
from tests.helpers import REPO, kill_group, start_worker, stop_process, wait_until
from tests.testapp import observe_tasks as t

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


def messages(job_id) -> list[list[str]]:
    return [
        [r["message"] for r in log.records]
        for log in JobLog.objects.filter(job_id=int(job_id)).order_by("lease_version")
    ]


def run_until_completed(job, tmp_path, **env: str) -> None:
    """A real worker runs `job` (and its retries) until it completes."""
    proc = start_worker("--queues", "default", log=tmp_path / "worker.log", env=env)
    try:
        wait_until(lambda: Job.objects.get(pk=int(job.id)).state == "completed", timeout=60)
    finally:
        stop_process(proc)
        kill_group(proc)


def test_concurrent_slots_keep_each_jobs_records_apart_sync_and_async(tmp_path):
    jobs = [t.logs_lines.enqueue(f"sync{i}", 5, 0.01) for i in range(4)]
    jobs += [t.logs_lines_async.enqueue(f"async{i}", 5, 0.01) for i in range(4)]
    proc = start_worker("--queues", "default", "--concurrency", "4", "--burst",
                        log=tmp_path / "worker.log")  # fmt: skip
    try:
        assert proc.wait(120) == 0
    finally:
        kill_group(proc)
    for job in jobs:
        label = Job.objects.get(pk=int(job.id)).args[0]
        (log,) = messages(job.id)
        expected = [f"{label} line {i}" for i in range(5)]
        if label.startswith("async"):
            expected += [f"{label} from a task", f"{label} from to_thread"]
        assert log == expected  # no info lines, no other job's, no other thread's
    row = JobLog.objects.get(job_id=int(jobs[0].id))
    assert row.attempt == 1 and row.dropped == 0 and row.records[0]["level"] == "WARNING"
    assert row.records[0]["logger"] == "tests.observe"


def test_each_attempt_keeps_its_own_log_and_the_job_page_shows_it(tmp_path, admin_client):
    job = t.logs_then_fails.enqueue("twice")
    run_until_completed(job, tmp_path)
    assert messages(job.id) == [["twice attempt 1"], ["twice attempt 2"]]
    page = admin_client.get(f"/admin/conveyor/job/{job.id}/change/").content.decode()
    assert "twice attempt 1" in page and "twice attempt 2" in page


def test_a_flood_is_cut_at_the_bound_with_a_count_of_what_was_dropped(tmp_path, admin_client):
    job = t.floods.enqueue("flood", 2000)  # about 230 KiB of messages
    proc = start_worker("--queues", "default", "--burst", log=tmp_path / "worker.log")
    try:
        assert proc.wait(60) == 0
    finally:
        kill_group(proc)
    row = JobLog.objects.get(job_id=int(job.id))
    kept = sum(len(r["message"]) for r in row.records)
    assert kept <= 64 * 1024 < kept + 120
    assert row.dropped == 2000 - len(row.records) > 0
    page = admin_client.get(f"/admin/conveyor/job/{job.id}/change/").content.decode()
    assert f"[{row.dropped} more records dropped: the log of an attempt keeps 64 KiB" in page


def test_level_none_keeps_no_records(tmp_path):
    job = t.logs_then_fails.enqueue("quiet")
    run_until_completed(
        job, tmp_path, CONVEYOR_TEST_CONVEYOR_JSON=json.dumps({"JOB_LOG_LEVEL": None})
    )
    assert not JobLog.objects.exists()


def test_a_stale_attempts_log_is_refused_by_its_token():
    job = JobFactory(state="running", lease_owner="w1", lease_version=3, attempt=1)
    logs = [{"id": job.id, "version": 2, "records": [{"message": "stale"}], "dropped": 0}]
    with connection.cursor() as cursor:
        protocol.attempt_log(cursor, owner="w1", logs=logs)
        assert not JobLog.objects.exists()
        logs[0]["version"] = 3
        protocol.attempt_log(cursor, owner="w1", logs=logs)
    (row,) = JobLog.objects.all()
    assert (row.job_id, row.lease_version, row.records) == (job.id, 3, [{"message": "stale"}])


def test_prune_deletes_the_logs_of_the_jobs_it_deletes():
    old = JobFactory(state="completed", finished_at="2000-01-01T00:00:00Z", lease_version=1)
    kept = JobFactory(state="completed", lease_version=1)
    for job in (old, kept):
        JobLog.objects.create(job=job, lease_version=1, attempt=1, worker="w",
                              records=[], dropped=1, written_at=job.enqueued_at)  # fmt: skip
    call_command("conveyor_prune", "--older-than", "86400", verbosity=0)
    assert list(JobLog.objects.values_list("job_id", flat=True)) == [kept.id]
    assert not Job.objects.filter(pk=old.id).exists()


def test_the_api_returns_each_attempts_log(client, tmp_path):
    from django_conveyor.api import keys

    job = t.logs_then_fails.enqueue("api")
    run_until_completed(job, tmp_path)
    headers = {"HTTP_AUTHORIZATION": "Bearer " + keys.create("svc", ["read"])[1]}
    body = client.get(f"/conveyor/api/jobs/{job.id}/logs", **headers).json()
    assert [(a["attempt"], [r["message"] for r in a["records"]]) for a in body] == [
        (1, ["api attempt 1"]),
        (2, ["api attempt 2"]),
    ]


LIBRARY_ERROR = """
import logging
from django_conveyor.observability import joblogs
joblogs.install(logging.WARNING if "{mode}" == "on" else None)
logging.getLogger("some.library").error("boom from a library")
logging.getLogger("some.library").info("quiet detail")
"""


@pytest.mark.parametrize("mode", ["on", "off"])
def test_capturing_does_not_silence_an_unconfigured_loggers_errors(mode):
    """Python prints a record no handler takes (logging.lastResort); the capture
    handler on the root logger must not change that, as it did on Django 5.2,
    where django-tasks' own traceback of a dead job then went unprinted."""
    proc = subprocess.run(
        [sys.executable, "-c", LIBRARY_ERROR.format(mode=mode)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("boom from a library") == 1, proc.stderr
    assert "quiet detail" not in proc.stderr
