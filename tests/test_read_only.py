"""A worker on a read-only server (a standby, a demoted or fenced primary) says so and moves on."""

import pytest
from django.db import connection

from django_conveyor.models import Job
from tests.helpers import run_burst, stop_process, wait_until
from tests.helpers import start_logged_worker as worker
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

READ_ONLY_LINE = "database is read-only (a standby or a demoted primary?)"


def set_read_only(on: bool) -> None:
    """New sessions of the test database start read-only, as on a fenced primary."""
    name = connection.settings_dict["NAME"]
    action = (
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" {action}')


def test_a_worker_on_a_read_only_server_logs_one_line_per_attempt_and_carries_on(procs, tmp_path):
    result = tasks.apply_once.enqueue("ro")
    log = tmp_path / "ro.log"
    set_read_only(True)
    try:
        proc = worker(procs, tmp_path, "ro", "--lease", "5")
        wait_until(lambda: log.read_text().count(READ_ONLY_LINE) >= 3, timeout=60)
        assert proc.poll() is None  # Still running: it never exits over a read-only server.
        assert Job.objects.get(pk=result.id).state == "available"
    finally:
        set_read_only(False)
    # Once a session may write again (here: the same server; in production:
    # libpq's next host), the next reconnect claims and completes the job.
    wait_until(lambda: Job.objects.get(pk=result.id).state == "completed", timeout=60)
    assert stop_process(proc) == 0
    text = log.read_text()
    lines = [line for line in text.splitlines() if READ_ONLY_LINE in line]
    assert all("reconnecting in" in line for line in lines), lines
    assert "Traceback" not in text and "control loop error" not in text


def test_a_handler_refused_by_a_read_only_server_gets_a_new_connection_for_its_retry():
    result = tasks.fenced_once_then_apply.enqueue("fenced")
    # One slot: the retry runs in the thread whose connection was read-only.
    run_burst(concurrency=1, max_jobs=2, burst=False)
    row = Job.objects.get(pk=result.id)
    assert (row.state, row.attempt) == ("completed", 2)
    assert "read-only transaction" in row.errors[0]["traceback"]
    assert Effect.objects.filter(job_id=row.id).count() == 1
