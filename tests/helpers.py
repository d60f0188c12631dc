"""Test helpers: real worker processes, in-process workers, waiting on state."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from django.db import connection, connections
from psycopg.conninfo import make_conninfo

from django_conveyor.conf import conveyor_settings
from django_conveyor.models import Job
from django_conveyor.tasks import resolve_task
from django_conveyor.worker.config import WorkerOptions
from django_conveyor.worker.connections import connection_params
from django_conveyor.worker.loop import Worker

REPO = Path(__file__).resolve().parent.parent


def clear_task_caches() -> None:
    resolve_task.cache_clear()
    conveyor_settings.cache_clear()


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll observable state until `predicate()` is truthy; fail with its last value."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)
        value = predicate()
    return value


def waiting_backends() -> int:
    """Backends of the test database that wait for a lock held by another transaction."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cur.fetchone()[0]


def run_burst(**options: Any) -> Worker:
    """Run an in-process worker until nothing is ready; returns it for its stats."""
    options.setdefault("queues", ("default", "emails", "slow"))
    options.setdefault("burst", True)
    options.setdefault("listen", False)
    options.setdefault("stop_signals", ())  # The test runner keeps its own handlers.
    worker = Worker(WorkerOptions(**options))
    assert worker.run() == 0
    return worker


def state_of(job_id: int | str) -> str:
    return Job.objects.get(pk=int(job_id)).state


def direct_dsn() -> str | None:
    """The test database, bypassing PgBouncer when the suite runs behind one."""
    base = os.environ.get("CONVEYOR_TEST_DIRECT_DSN")
    return make_conninfo(base, dbname=connection.settings_dict["NAME"]) if base else None


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["CONVEYOR_DB_NAME"] = connection.settings_dict["NAME"]
    env["CONVEYOR_SHARD_DB_NAME"] = connections["shard"].settings_dict["NAME"]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def start_worker(
    *args: str,
    log: Path | None = None,
    settings: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A real `manage.py conveyor_worker` process against the test database.

    `settings`: another settings module (one that imports tests.settings);
    `env`: more environment variables.
    """
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    environment = {**worker_env(), **(env or {})}
    if settings:
        environment["DJANGO_SETTINGS_MODULE"] = settings
    return subprocess.Popen(
        [sys.executable, "-m", "django", "conveyor_worker", "-v", "2", *args],
        cwd=REPO,
        env=environment,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def start_logged_worker(
    procs: list[subprocess.Popen[bytes]], tmp_path: Path, name: str, *args: str
) -> subprocess.Popen[bytes]:
    """A worker of the queue "default" logging to tmp_path/<name>.log, killed after the test."""
    proc = start_worker("--queues", "default", *args, log=tmp_path / f"{name}.log")
    procs.append(proc)
    return proc


STOP_MARGIN_SECONDS = 30.0  # Past the worker's own shutdown timeout: hand-back, flush, exit.


def stop_wait_seconds() -> float:
    """How long a test waits for a worker it stopped: longer than the worker may take.

    A worker may wait its whole shutdown timeout for a handler still running
    before it hands the job back, so a shorter wait would kill a worker that
    does exactly what it should.
    """
    return conveyor_settings().SHUTDOWN_TIMEOUT_SECONDS + STOP_MARGIN_SECONDS


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float | None = None
) -> int:
    """Send `sig`; the exit status, or -9 after killing a process that outlived the wait."""
    timeout = stop_wait_seconds() if timeout is None else timeout
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(10)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Make sure nothing a test started outlives it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def database_url(name: str) -> str:
    """DATABASE_URL for database *name* on the suite's server, in django-environ's form."""
    s = connection.settings_dict
    port = s.get("PORT") or 5432
    if not s.get("HOST") or s["HOST"].startswith("/"):
        return f"postgresql://{quote(s['USER'])}@:{port}/{quote(s['HOST'] or '', safe='')}/{name}"
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgresql://{quote(s['USER'])}{password}@{s['HOST']}:{port}/{name}"


@contextlib.contextmanager
def scratch_database(name: str) -> Iterator[str]:
    """A new, empty database on the suite's server, dropped afterwards; yields its URL."""

    def admin(sql: str) -> None:
        params = {**connection_params("default"), "dbname": "postgres"}
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(sql)

    admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin(f"CREATE DATABASE {name}")
    try:
        yield database_url(name)
    finally:
        admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
