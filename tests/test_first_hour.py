"""What a newcomer meets first, with real processes: each mistake gets its one clear answer.

A worker started before `migrate`, a cron entry that cannot run, a database
that is down, a role whose statement_timeout is below what the worker
needs, a retry in the log, `TASKS` left out, SQLite.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
from django.core import checks
from django.db import connection
from django.test import override_settings

from django_conveyor.models import Job
from tests.helpers import (
    REPO,
    kill_group,
    run_burst,
    scratch_database,
    start_worker,
    stop_process,
    wait_until,
    worker_env,
)
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATE_HINT = "run `manage.py migrate`"
try:
    import django.tasks  # noqa: F401

    IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
except ImportError:  # Django 5.2: the backport.
    IMMEDIATE = "django_tasks.backends.immediate.ImmediateBackend"


def until_final(job_id: int) -> str:
    """Run in-process bursts until the job is final (a retry waits for its backoff)."""
    for _ in range(50):
        run_burst()
        state = Job.objects.get(pk=job_id).state
        if state in ("completed", "failed", "dead", "cancelled"):
            return state
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} never finished")


def manage(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=REPO, env={**worker_env(), **(env or {})},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def on(database: str) -> dict[str, str]:
    """The environment of a process of the test settings on another database."""
    return {"CONVEYOR_DB_NAME": database, "CONVEYOR_SHARD_DB_NAME": database}


@pytest.mark.slow
class TestAWorkerBeforeMigrate:
    @pytest.mark.parametrize("burst", [["--burst"], []], ids=["burst", "serving"])
    def test_no_table_exits_1_with_one_line_saying_migrate(self, burst):
        with scratch_database("conveyor_not_migrated"):
            proc = manage("conveyor_worker", "--queues", "default", *burst,
                          env=on("conveyor_not_migrated"))  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert MIGRATE_HINT in proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr

    def test_unapplied_conveyor_migrations_are_named(self):
        with scratch_database("conveyor_half_migrated"):
            env = on("conveyor_half_migrated")
            assert manage("migrate", "conveyor", "0005", "-v", "0", env=env).returncode == 0
            proc = manage("conveyor_worker", "--queues", "default", "--burst", env=env)
        assert proc.returncode == 1
        assert "0006_workflows" in proc.stderr and MIGRATE_HINT in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_burst_with_the_database_down_gives_up_after_its_bound_and_exits_1():
    from django_conveyor.worker.loop import BURST_GIVE_UP_SECONDS

    # A port nothing listens on: every connection is refused at once.
    env = {"DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none"}
    started = time.monotonic()
    proc = manage("conveyor_worker", "--queues", "default", "--burst", env=env,
                  timeout=BURST_GIVE_UP_SECONDS + 60)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert time.monotonic() - started >= BURST_GIVE_UP_SECONDS
    assert f"for {BURST_GIVE_UP_SECONDS:.0f}s" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("skip_checks", [[], ["--skip-checks"]], ids=["checks", "--skip-checks"])
def test_an_invalid_cron_entry_stops_the_worker_naming_it(skip_checks):
    cron = {"CRON": {"every-zero": {"schedule": "*/0 * * * *", "task": "tests.testapp.tasks.noop"}}}
    proc = manage("conveyor_worker", "--queues", "default", "--burst", *skip_checks,
                  env={"CONVEYOR_TEST_CONVEYOR_JSON": json.dumps(cron)})  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "CONVEYOR['CRON']['every-zero']['schedule']" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_statement_timeout_below_the_claim_is_named_once(tmp_path):
    """A role or database statement_timeout the claim cannot meet: SQLSTATE 57014, said once."""
    with scratch_database("conveyor_short_timeout"):
        env = on("conveyor_short_timeout")
        assert manage("migrate", "-v", "0", env=env).returncode == 0
        params = {**connection.get_connection_params(), "dbname": "conveyor_short_timeout"}
        for name in ("cursor_factory", "context", "server_side_binding", "pool"):
            params.pop(name, None)
        import psycopg

        with psycopg.connect(**params, autocommit=True) as admin:
            admin.execute("ALTER DATABASE conveyor_short_timeout SET statement_timeout = '300ms'")
            # The claim waits behind this lock, and its statement_timeout cancels it.
            blocker = psycopg.connect(**params)
            blocker.execute("LOCK TABLE conveyor_job IN ACCESS EXCLUSIVE MODE")
            log = tmp_path / "worker.log"
            proc = start_worker("--queues", "default", log=log, env=env)
            try:
                wait_until(lambda: log.read_text().count("57014") >= 1, timeout=60)
                # Several more passes, all cancelled the same way.
                wait_until(lambda: log.read_text().count("cancelled again") >= 3, timeout=60)
                blocker.rollback()
                assert stop_process(proc) == 0
            finally:
                blocker.close()
                kill_group(proc)
    text = log.read_text()
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1, text[-3000:]
    assert "statement_timeout" in errors[0] and "300ms" in errors[0], errors[0]
    assert "database unavailable" not in text


class TestARetryInTheLog:
    def test_one_warning_line_with_the_error_and_the_next_run_time(self, caplog):
        job = tasks.fails_then_succeeds.enqueue(1)
        with caplog.at_level(logging.DEBUG):
            assert until_final(int(job.id)) == "completed"
        records = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.levelname for r in records] == ["WARNING"], [r.getMessage() for r in records]
        (warning,) = records
        message = warning.getMessage()
        assert "attempt 1 of 5 failed" in message and "RuntimeError" in message, message
        assert "retrying at " in message, message
        assert warning.exc_info is None
        assert not any(r.exc_info for r in caplog.records), "a traceback was logged"

    def test_a_dead_job_still_logs_its_traceback(self, caplog):
        job = tasks.always_fails.enqueue("for good")
        with caplog.at_level(logging.DEBUG):
            assert until_final(int(job.id)) == "dead"
        tracebacks = [r for r in caplog.records if r.exc_info]
        assert [r.levelname for r in tracebacks] == ["ERROR"]  # The last attempt, dead.


class TestTasksLeftOut:
    @override_settings(TASKS={"default": {"BACKEND": IMMEDIATE}})
    def test_a_warning_when_no_alias_uses_conveyor_backend(self):
        from django_conveyor.checks import check_backend

        (warning,) = list(check_backend())
        assert warning.id == "conveyor.W011"
        assert isinstance(warning, checks.Warning)
        assert "ImmediateBackend" in warning.msg and "ConveyorBackend" in warning.hint

    def test_silent_when_an_alias_uses_it(self):
        from django_conveyor.checks import check_backend

        assert list(check_backend()) == []


def test_a_retry_sends_task_finished_as_ready_not_failed():
    from django_conveyor.compat import TaskResultStatus, task_finished

    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.status)

    task_finished.connect(receiver)
    try:
        job = tasks.fails_then_succeeds.enqueue(1)
        assert until_final(int(job.id)) == "completed"
    finally:
        task_finished.disconnect(receiver)
    assert seen == [TaskResultStatus.READY, TaskResultStatus.SUCCESSFUL]


class TestSQLite:
    """A project whose DATABASES is still SQLite: E020 once, and enqueue says the same."""

    @pytest.fixture
    def project(self, tmp_path):
        (tmp_path / "mysite").mkdir()
        (tmp_path / "mysite" / "__init__.py").write_text("")
        (tmp_path / "mysite" / "settings.py").write_text(
            "SECRET_KEY = 'x'\nUSE_TZ = True\n"
            "INSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth',"
            " 'django_conveyor', 'mysite']\n"
            f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3',"
            f" 'NAME': '{tmp_path / 'db.sqlite3'}'}}}}\n"
            "TASKS = {'default': {'BACKEND': 'django_conveyor.backend.ConveyorBackend'}}\n"
            "try:\n    import django.tasks\nexcept ImportError:\n"
            "    INSTALLED_APPS.append('django_tasks')\n"
        )
        (tmp_path / "mysite" / "tasks.py").write_text(
            "from django_conveyor import task\n\n\n@task()\ndef hello():\n    return 1\n"
        )
        return tmp_path

    def run(self, project, *args):
        env = {k: v for k, v in worker_env().items() if not k.startswith("CONVEYOR_")}
        env.update(DJANGO_SETTINGS_MODULE="mysite.settings", PYTHONPATH=str(project))
        return subprocess.run([sys.executable, "-m", "django", *args], cwd=project, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    def test_check_reports_e020_alone(self, project):
        proc = self.run(project, "check")
        assert proc.returncode == 1
        assert "conveyor.E020" in proc.stderr
        assert "models.W040" not in proc.stderr and "models.W037" not in proc.stderr, proc.stderr
        assert "System check identified 1 issue" in proc.stderr

    def test_enqueue_from_the_shell_says_e020s_sentence(self, project):
        proc = self.run(project, "shell", "-c", "from mysite.tasks import hello; hello.enqueue()")
        assert proc.returncode == 1
        assert "django-conveyor needs PostgreSQL, but DATABASES['default'] uses" in proc.stderr
        assert 'near "("' not in proc.stderr
