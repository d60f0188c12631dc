"""What migration 0010 sets on conveyor_job, read back from PostgreSQL's catalogue.

Both settings are invisible to the other tests: an index over every row, or
the server's autovacuum defaults, still give correct results and only slow a
busy queue down (docs/performance.md, the sustained run).
"""

import importlib

import pytest
from django.db import IntegrityError, connection, transaction

from tests.testapp import tasks

pytestmark = pytest.mark.django_db

STORAGE = importlib.import_module("django_conveyor.migrations.0010_lean_indexes").STORAGE


def indexes_on(column: str) -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE tablename = 'conveyor_job' AND indexdef LIKE %s",
            [f"%({column}%"],
        )
        return dict(cur.fetchall())


def test_the_idempotency_key_is_unique_among_keyed_rows_only():
    indexes = indexes_on("idempotency_key")
    assert set(indexes) == {"conveyor_job_idempotency_key_uniq"}
    definition = indexes["conveyor_job_idempotency_key_uniq"]
    assert "UNIQUE" in definition and "WHERE (idempotency_key IS NOT NULL)" in definition


def test_keys_stay_unique_and_unkeyed_jobs_do_not_collide():
    first = tasks.noop.using(idempotency_key="k").enqueue()
    again = tasks.noop.using(idempotency_key="k").enqueue()
    assert again.id == first.id
    unkeyed = {tasks.noop.enqueue().id for _ in range(3)}
    assert len(unkeyed) == 3
    with connection.cursor() as cur, pytest.raises(IntegrityError), transaction.atomic():
        cur.execute(
            "INSERT INTO conveyor_job (task_path, args, kwargs, queue, backend, priority, state,"
            " attempt, max_attempts, run_after, lease_version, errors, enqueued_at,"
            " idempotency_key) SELECT task_path, args, kwargs, queue, backend, priority, state,"
            " attempt, max_attempts, run_after, lease_version, errors, enqueued_at,"
            " idempotency_key FROM conveyor_job WHERE idempotency_key = 'k'"
        )


def test_the_job_table_has_its_own_autovacuum_settings():
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE relname = 'conveyor_job'")
        (options,) = cur.fetchone()
    assert dict(option.split("=", 1) for option in options) == STORAGE
