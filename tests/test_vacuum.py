"""Workers vacuum conveyor_job past CONVEYOR["VACUUM_DEAD_ROWS"] (worker/vacuum.py).

Observed in PostgreSQL's own statistics: `vacuum_count` of the table counts
the passes that were not autovacuum's, `n_dead_tup` the dead row versions.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from django_conveyor.conf import DEFAULT_VACUUM_DEAD_ROWS
from django_conveyor.worker.config import WorkerConfig, WorkerOptions
from django_conveyor.worker.connections import connect
from django_conveyor.worker.services.base import Now
from django_conveyor.worker.services.vacuum import (
    MAX_WAIT_SECONDS,
    VacuumCounts,
    VacuumService,
    may_vacuum,
)
from tests.helpers import start_worker, stop_process, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

GUEST = "conveyor_vacuum_guest"


def table_stats() -> tuple[int, int]:
    """(vacuum_count, n_dead_tup) of conveyor_job, read fresh (autocommit)."""
    with connect("default") as conn:
        row = conn.execute(
            "SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables"
            " WHERE relid = 'conveyor_job'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def make_dead_versions(jobs: int) -> None:
    """`jobs` finished jobs, each updated once more: `jobs` dead versions at least."""
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state,"
            " attempt, max_attempts, run_after, lease_version, errors, enqueued_at, finished_at)"
            " SELECT 'tests.testapp.tasks.noop', '[]', '{}', 'vacuumed', 'default', 0,"
            " 'completed', 1, 5, now(), 1, '[]', now(), now() FROM generate_series(1, %s)",
            [jobs],
        )
        cur.execute("UPDATE conveyor_job SET priority = 1 WHERE queue = 'vacuumed'")
    connection.close()  # A backend that ends reports its statistics at once.


def dead_at_least(count: int) -> bool:
    return table_stats()[1] >= count


@pytest.fixture
def no_autovacuum():
    """Autovacuum (and its analyze) left out of conveyor_job for the test: a pass of its
    own would take the dead versions, or hold the table's lock so that the worker's
    SKIP_LOCKED pass skips, and the worker would rightly not vacuum."""
    with connect("default") as conn:
        conn.execute("ALTER TABLE conveyor_job SET (autovacuum_enabled = false)")
    yield
    with connect("default") as conn:
        conn.execute("ALTER TABLE conveyor_job RESET (autovacuum_enabled)")


def test_a_worker_vacuums_the_job_table_past_its_threshold(tmp_path, no_autovacuum):
    make_dead_versions(3000)
    wait_until(lambda: dead_at_least(3000))
    passes_before, _ = table_stats()
    proc = start_worker(
        "--queues", "default",
        log=tmp_path / "worker.log",
        env={"CONVEYOR_TEST_CONVEYOR_JSON": json.dumps({"VACUUM_DEAD_ROWS": 1000})},
    )  # fmt: skip
    try:
        wait_until(lambda: table_stats()[0] > passes_before, timeout=60)
        wait_until(lambda: table_stats()[1] < 1000)
    finally:
        assert stop_process(proc) == 0
    assert "vacuumed conveyor_job" in (tmp_path / "worker.log").read_text()


def look(service: VacuumService) -> VacuumCounts:
    """One look on a connection like the control loop's, and the pass it started."""
    with connect("default") as conn, conn.cursor() as cursor:
        counts = service.run_once(cursor, Now.read())
    if service.pass_thread is not None:
        service.pass_thread.join(30)
        assert not service.pass_thread.is_alive()
    return counts


def test_no_pass_below_the_threshold():
    make_dead_versions(1500)
    wait_until(lambda: dead_at_least(1500))
    passes_before, _ = table_stats()
    service = VacuumService(database="default", dead_rows=1_000_000)
    assert look(service) == VacuumCounts(vacuum_passes=0)
    assert service.pass_thread is None
    assert table_stats()[0] == passes_before


def test_none_turns_it_off(settings):
    assert WorkerConfig.resolve(WorkerOptions()).vacuum_dead_rows == DEFAULT_VACUUM_DEAD_ROWS
    settings.CONVEYOR = {**settings.CONVEYOR, "VACUUM_DEAD_ROWS": None}
    assert WorkerConfig.resolve(WorkerOptions()).vacuum_dead_rows is None


def test_a_pass_that_cannot_remove_them_waits_longer_next_time():
    """A transaction older than the dead versions keeps them: the next look waits."""
    service = VacuumService(database="default", dead_rows=1000, interval=0.5)
    with connect("default") as old:
        old.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        old.execute("SELECT count(*) FROM conveyor_job").fetchone()  # Its snapshot is taken.
        make_dead_versions(2000)
        wait_until(lambda: dead_at_least(2000))
        passes_before, _ = table_stats()
        try:
            assert look(service) == VacuumCounts(vacuum_passes=1)
            wait_until(lambda: table_stats()[0] == passes_before + 1)
            assert service.wait == 1.0  # Doubled: the versions were still needed.
            for _ in range(10):
                look(service)
            assert service.wait == MAX_WAIT_SECONDS
        finally:
            old.execute("ROLLBACK")
    assert look(service) == VacuumCounts(vacuum_passes=1)
    assert service.wait == 0.5  # Nothing holds them now: back to the usual look.
    wait_until(lambda: table_stats()[1] < 1000)


def test_a_pass_another_holds_the_table_for_is_skipped_and_waits_longer(caplog):
    """SKIP_LOCKED: while another pass (here, a lock of the same mode) holds it."""
    make_dead_versions(2000)
    wait_until(lambda: dead_at_least(2000))
    passes_before, _ = table_stats()
    service = VacuumService(database="default", dead_rows=1000, interval=0.5)
    with connect("default") as other, caplog.at_level("DEBUG", "django_conveyor"):
        other.execute("BEGIN")
        other.execute("LOCK TABLE conveyor_job IN SHARE UPDATE EXCLUSIVE MODE")
        try:
            assert look(service) == VacuumCounts(vacuum_passes=1)
        finally:
            other.execute("ROLLBACK")
    assert service.wait == 1.0
    assert table_stats()[0] == passes_before  # Not vacuumed: skipped at once.
    assert "skipped (another pass holds it) conveyor_job" in caplog.text
    assert look(service) == VacuumCounts(vacuum_passes=1)
    assert service.wait == 0.5
    wait_until(lambda: table_stats()[0] == passes_before + 1)


def test_a_pass_that_fails_is_said_and_waits_longer(caplog):
    """Its thread has no loop above it: the failure is logged there, and backs off."""
    make_dead_versions(2000)
    wait_until(lambda: dead_at_least(2000))
    service = VacuumService(database="no-such-alias", dead_rows=1000, interval=0.5)
    with caplog.at_level("WARNING", "django_conveyor"):
        assert look(service) == VacuumCounts(vacuum_passes=1)
    assert service.wait == 1.0
    assert "vacuum of conveyor_job failed (ConnectionDoesNotExist" in caplog.text


@pytest.fixture
def guest():
    with connection.cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {GUEST}")
        cur.execute(f"CREATE ROLE {GUEST}")
    yield GUEST
    with connection.cursor() as cur:
        cur.execute(f"DROP ROLE IF EXISTS {GUEST}")


def test_only_a_role_that_may_vacuum_the_table_looks(guest):
    with connect("default") as conn:
        assert may_vacuum(conn) is True  # The tests' role owns the table.
        conn.execute(f"SET ROLE {guest}")
        assert may_vacuum(conn) is False
        conn.execute("RESET ROLE")
        conn.execute(f"GRANT {conn.info.user} TO {guest}")
        conn.execute(f"SET ROLE {guest}")
        assert may_vacuum(conn) is True  # A member of the owner's role may.
        conn.execute("RESET ROLE")
        conn.execute(f"REVOKE {conn.info.user} FROM {guest}")


def test_the_setting_is_checked():
    from django_conveyor.conf import problems

    assert problems({"VACUUM_DEAD_ROWS": None}) == []
    assert problems({"VACUUM_DEAD_ROWS": 50_000}) == []
    (problem,) = problems({"VACUUM_DEAD_ROWS": 10})
    assert "VACUUM_DEAD_ROWS" in problem.msg
    (problem,) = problems({"VACUUM_DEAD_ROWS": "many"})
    assert "VACUUM_DEAD_ROWS" in problem.msg
