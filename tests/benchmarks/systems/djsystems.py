"""Adapters for the Django-based systems: django-conveyor, django-tasks-db, django-ox."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from bench_common import SYSTEMS_DIR

MANAGE = str(SYSTEMS_DIR / "djproject" / "manage.py")
FLOOR_TABLE = "bench_floor"
FLOOR_DDL = (
    f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} "
    "(id bigserial PRIMARY KEY, payload jsonb NOT NULL, created_at timestamptz DEFAULT now())"
)
FLOOR_INSERT = f"INSERT INTO {FLOOR_TABLE} (payload) VALUES (%s)"


def setup_django(system: str, database_url: str) -> None:
    os.environ["BENCH_DJANGO_SYSTEM"] = system
    os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "djproject.settings"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SYSTEMS_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    import django

    django.setup()


def table_stats_sql(table: str) -> str:
    return (
        "SELECT n_live_tup, n_dead_tup, pg_total_relation_size(relid) / 1048576.0,"
        " autovacuum_count, autoanalyze_count"
        f" FROM pg_stat_user_tables WHERE relname = '{table}'"
    )


def stats_row(row: Sequence[Any] | None) -> dict[str, Any] | None:
    if not row:
        return None
    live, dead, size_mb, vacuums, analyzes = row
    return {
        "n_live_tup": int(live),
        "n_dead_tup": int(dead),
        "size_mb": round(float(size_mb), 1),
        "autovacuum_count": int(vacuums),
        "autoanalyze_count": int(analyzes),
    }


class StoreQueries:
    """What the harness asks of a system's PostgreSQL store, given `self.sql`."""

    finished_sql = ""
    pending_sql = ""
    main_table: str | None = None

    def sql(self, statement: str, params: Sequence[Any] | None = None) -> list[Any]:
        raise NotImplementedError

    def count_finished(self) -> int:
        return int(self.sql(self.finished_sql)[0][0])

    def pending(self) -> int:
        return int(self.sql(self.pending_sql)[0][0])

    def analyze(self) -> None:
        self.sql("ANALYZE")

    def table_stats(self) -> dict[str, Any] | None:
        if not self.main_table:
            return None
        rows = self.sql(table_stats_sql(self.main_table))
        return stats_row(rows[0] if rows else None)

    def floor_setup(self) -> None:
        self.sql(FLOOR_DDL)


class DjangoAdapter(StoreQueries):
    name = "django"
    has_burst = True
    floor_description = (
        f"INSERT INTO {FLOOR_TABLE} (payload jsonb) on Django's connection, autocommit "
        "(its own transaction: one round trip, one commit)"
    )
    bulk_description = "the system's bulk API"

    def __init__(self, params: dict[str, Any]) -> None:
        setup_django(self.name, params["database_url"])
        self.database_url = params["database_url"]

    @staticmethod
    def task(kind: str) -> Any:
        from djproject import jobs

        return jobs.KINDS[kind]

    def install(self) -> dict[str, Any]:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        return {}

    def sql(self, statement: str, params: Sequence[Any] | None = None) -> list[Any]:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def enqueue_one(self, kind: str, seq: int) -> None:
        self.task(kind).enqueue(seq)

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        from django.db import transaction

        task = self.task(kind)
        with transaction.atomic():
            for seq in seqs:
                task.enqueue(seq)

    def floor_insert(self, i: int) -> None:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(FLOOR_INSERT, [json.dumps([i])])

    def manage(self, *args: str) -> list[str]:
        # -v 0 for every Django system: no per-job log lines on the hot path
        return [sys.executable, MANAGE, *args, "--verbosity", "0"]

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class TasksDbAdapter(DjangoAdapter):
    name = "django-tasks-db"
    main_table = "django_tasks_database_dbtaskresult"
    finished_sql = f"SELECT count(*) FROM {main_table} WHERE status = 'SUCCESSFUL'"
    pending_sql = f"SELECT count(*) FROM {main_table} WHERE status IN ('READY', 'RUNNING')"
    bulk_description = "enqueue() per job inside one transaction (no bulk API)"

    def worker_argvs(
        self, kind: str, processes: int, setting: dict[str, Any], burst: bool
    ) -> list[list[str]]:
        # one task at a time per process: for the relay's slots, slots are processes
        argv = self.manage(
            "db_worker",
            "--queue-name",
            "default",
            "--interval",
            str(setting.get("interval", 0.1)),
            "--no-startup-delay",
            "--no-reload",
        )
        argv += ["--batch"] if burst else []
        count = processes * int(setting.get("processes_per_slot", 1))
        return [list(argv) for _ in range(count)]

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        return {
            "command": "db_worker",
            "processes": processes * int(setting.get("processes_per_slot", 1)),
            "tasks_per_process": 1,
            "interval_s": setting.get("interval", 0.1),
            "wakeup": "polling only",
        }


class OxAdapter(DjangoAdapter):
    name = "django-ox"
    main_table = "django_ox_oxtask"
    finished_sql = f"SELECT count(*) FROM {main_table} WHERE status = 'SUCCESSFUL'"
    pending_sql = f"SELECT count(*) FROM {main_table} WHERE status IN ('READY', 'RUNNING')"
    bulk_description = "django_ox.bulk.enqueue_many"

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        from django_ox.bulk import enqueue_many

        enqueue_many(self.task(kind), [((seq,), {}) for seq in seqs])

    def worker_argvs(
        self, kind: str, processes: int, setting: dict[str, Any], burst: bool
    ) -> list[list[str]]:
        # --processes cannot be combined with --batch, so one command per process
        argv = self.manage(
            "ox_worker",
            "--queues",
            "default",
            "--concurrency",
            str(setting.get("concurrency", 4)),
            "--interval",
            str(setting.get("interval", 0.1)),
        )
        argv += ["--batch"] if burst else []
        return [list(argv) for _ in range(processes)]

    def knobs(self, kind: str, processes: int, setting: dict[str, Any]) -> dict[str, Any]:
        return {
            "command": "ox_worker",
            "processes": processes,
            "concurrency": setting.get("concurrency", 4),
            "interval_s": setting.get("interval", 0.1),
            "wakeup": "polling only",
        }
