"""Adapters for the Django-based systems: django-conveyor, django-tasks-db, django-ox."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from bench_common import SYSTEMS_DIR

MANAGE = str(SYSTEMS_DIR / "djproject" / "manage.py")
POLL_INTERVAL = 0.1  # seconds, for the two polling-only peers


def setup_django(system: str, database_url: str) -> None:
    os.environ["BENCH_DJANGO_SYSTEM"] = system
    os.environ["BENCH_DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "djproject.settings"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(SYSTEMS_DIR), os.environ.get("PYTHONPATH", "")) if p
    )
    import django

    django.setup()


class DjangoAdapter:
    name = "django"
    has_burst = True
    finished_sql = ""

    def __init__(self, params: dict[str, Any]) -> None:
        setup_django(self.name, params["database_url"])

    @staticmethod
    def task(kind: str) -> Any:
        from djproject import jobs

        return jobs.KINDS[kind]

    def install(self) -> dict[str, Any]:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
        return {}

    def enqueue_one(self, kind: str, seq: int) -> None:
        self.task(kind).enqueue(seq)

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        from django.db import transaction

        task = self.task(kind)
        with transaction.atomic():
            for seq in seqs:
                task.enqueue(seq)

    def manage(self, *args: str) -> list[str]:
        # -v 0 for every Django system: no per-job log lines on the hot path
        return [sys.executable, MANAGE, *args, "--verbosity", "0"]

    def count_finished(self) -> int:
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute(self.finished_sql)
            return int(cur.fetchone()[0])

    def insert_finished(self, n: int) -> None:
        raise NotImplementedError(f"{self.name}: history pre-insert not implemented")

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class ConveyorAdapter(DjangoAdapter):
    name = "conveyor"
    finished_sql = "SELECT count(*) FROM conveyor_job WHERE state = 'completed'"

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        task = self.task(kind)
        for i in range(0, len(seqs), 5000):
            task.enqueue_many([((seq,), {}) for seq in seqs[i : i + 5000]])

    def worker_argvs(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[list[str]]:
        argv = self.manage(
            "conveyor_worker",
            "--queues",
            "default",
            "--concurrency",
            str(concurrency),
            "--processes",
            str(processes),
        )
        return [argv + (["--burst"] if burst else [])]

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        return {
            "command": "conveyor_worker",
            "processes": processes,
            "concurrency": concurrency,
            "bulk_enqueue": "enqueue_many (5,000 per call)",
            "wakeup": "LISTEN/NOTIFY + polling (package defaults)",
        }

    def insert_finished(self, n: int) -> None:
        """Clone one enqueued job n times as finished history, then VACUUM ANALYZE."""
        from django.db import connection

        self.task("noop").enqueue(-1)  # template row; never run (deleted below)
        overrides = {
            "state": "'completed'",
            "attempt": "1",
            "idempotency_key": "NULL",
            "lease_owner": "NULL",
            "lease_expires_at": "NULL",
            "started_at": "now()",
            "finished_at": "now()",
        }
        with connection.cursor() as cur:
            cur.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name = 'conveyor_job' AND column_name <> 'id'"
            )
            names = [row[0] for row in cur.fetchall()]
            values = [overrides.get(name, name) for name in names]
            cur.execute(
                f"INSERT INTO conveyor_job ({', '.join(names)})"
                f" SELECT {', '.join(values)} FROM conveyor_job, generate_series(1, %s)"
                " WHERE id = (SELECT max(id) FROM conveyor_job)",
                [n],
            )
            cur.execute("DELETE FROM conveyor_job WHERE state <> 'completed'")
            cur.execute("VACUUM ANALYZE conveyor_job")  # what autovacuum would do


class TasksDbAdapter(DjangoAdapter):
    name = "django-tasks-db"
    finished_sql = (
        "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'"
    )

    def worker_argvs(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[list[str]]:
        # one task at a time per process: slots are processes
        argv = self.manage(
            "db_worker",
            "--queue-name",
            "default",
            "--interval",
            str(POLL_INTERVAL),
            "--no-startup-delay",
            "--no-reload",
        )
        argv += ["--batch"] if burst else []
        return [list(argv) for _ in range(processes * concurrency)]

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        return {
            "command": "db_worker",
            "processes": processes * concurrency,
            "tasks_per_process": 1,
            "interval_s": POLL_INTERVAL,
            "bulk_enqueue": "enqueue() per job in one transaction (no bulk API)",
            "wakeup": "polling only",
        }


class OxAdapter(DjangoAdapter):
    name = "django-ox"
    finished_sql = "SELECT count(*) FROM django_ox_oxtask WHERE status = 'SUCCESSFUL'"

    def enqueue_bulk(self, kind: str, seqs: Sequence[int]) -> None:
        from django_ox.bulk import enqueue_many

        enqueue_many(self.task(kind), [((seq,), {}) for seq in seqs])

    def worker_argvs(
        self, kind: str, processes: int, concurrency: int, burst: bool
    ) -> list[list[str]]:
        # --processes cannot be combined with --batch, so one command per process
        argv = self.manage(
            "ox_worker",
            "--queues",
            "default",
            "--concurrency",
            str(concurrency),
            "--interval",
            str(POLL_INTERVAL),
        )
        argv += ["--batch"] if burst else []
        return [list(argv) for _ in range(processes)]

    def knobs(self, kind: str, processes: int, concurrency: int) -> dict[str, Any]:
        return {
            "command": "ox_worker",
            "processes": processes,
            "concurrency": concurrency,
            "interval_s": POLL_INTERVAL,
            "bulk_enqueue": "django_ox.bulk.enqueue_many",
            "wakeup": "polling only",
        }
