"""`manage.py conveyor_worker`: parse and validate, then hand over to the worker."""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from django_conveyor.conf import conveyor_settings
from django_conveyor.exceptions import ConveyorConfigurationError
from django_conveyor.management.arguments import (
    int_up_to,
    non_negative_seconds,
    port_number,
    positive_int,
    positive_seconds,
    queue_list,
    worker_id,
)
from django_conveyor.worker import preflight
from django_conveyor.worker.config import MAX_CONCURRENCY, WorkerConfig, WorkerOptions
from django_conveyor.worker.loop import Worker
from django_conveyor.worker.supervisor import Supervisor

MAX_PROCESSES = 256  # Worker processes one supervisor forks.


class Command(BaseCommand):
    help = "Run django-conveyor workers: claim jobs under fenced leases and run them."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--queues",
            "--queue-name",
            dest="queues",
            type=queue_list,
            default=None,
            help="Comma-separated queues to work (default: every queue of the backend's QUEUES).",
        )
        parser.add_argument(
            "--concurrency",
            type=int_up_to(MAX_CONCURRENCY),
            default=4,
            help="Handler slots per process (default 4).",
        )
        parser.add_argument(
            "--processes",
            type=int_up_to(MAX_PROCESSES),
            default=1,
            help="Worker processes to supervise (default 1).",
        )
        parser.add_argument(
            "--burst", "--batch", dest="burst", action="store_true",
            help="Work until no job is ready and none is held, then exit 0.",
        )  # fmt: skip
        parser.add_argument(
            "--lease",
            type=positive_seconds,
            default=None,
            help="Lease length in seconds (default CONVEYOR['LEASE_SECONDS']).",
        )
        parser.add_argument(
            "--shutdown-timeout", type=non_negative_seconds, default=None,
            help="Seconds in-flight handlers get after SIGTERM before leases are handed back.",
        )  # fmt: skip
        parser.add_argument(
            "--poll-only", action="store_true",
            help="Never LISTEN; poll only (for PgBouncer in transaction mode).",
        )  # fmt: skip
        parser.add_argument(
            "--interval",
            "--poll",
            dest="poll",
            type=positive_seconds,
            default=None,
            help="Idle poll interval in seconds.",
        )
        parser.add_argument(
            "--prefetch",
            type=int,
            default=None,
            help="Jobs claimed ahead of free slots (default: adaptive, see CONVEYOR['PREFETCH']).",
        )
        parser.add_argument(
            "--max-tasks",
            "--max-jobs",
            dest="max_jobs",
            type=positive_int,
            default=None,
            help="Exit after this many attempts.",
        )
        parser.add_argument(
            "--worker-id",
            type=worker_id,
            default=None,
            help="Worker id (default: host:pid:random).",
        )
        parser.add_argument(
            "--no-cron", action="store_true",
            help="Run no scheduler: enqueue no ticks of periodic schedules (CONVEYOR['CRON']).",
        )  # fmt: skip
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            default=None,
            help="Serve Prometheus metrics on this port; with --processes N, one port per "
            "process from this one up (needs django-conveyor[metrics]).",
        )
        parser.add_argument(
            "--metrics-address",
            default="0.0.0.0",
            help="Address the metrics port listens on (default 0.0.0.0: every interface).",
        )
        parser.add_argument(
            "--backend",
            default="default",
            help="The TASKS alias whose queues to work (default 'default').",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            configure_logging(options["verbosity"])
        except ConveyorConfigurationError as exc:  # Checks skipped: refuse it here, clearly.
            raise CommandError(str(exc)) from exc
        known = self.backend_queues(options["backend"])
        queues = options["queues"] or sorted(known)
        unknown = sorted(set(queues) - known) if known else []
        if unknown:
            raise CommandError(
                f"Unknown queue(s) {', '.join(unknown)}: backend {options['backend']!r} "
                f"accepts {', '.join(sorted(known))} (its TASKS QUEUES setting)."
            )
        if not queues:
            raise CommandError("The backend accepts any queue name; pass --queues explicitly.")
        if options["prefetch"] is not None and options["prefetch"] < 0:
            raise CommandError("--prefetch must be zero or more.")
        if options["worker_id"] and options["processes"] > 1:
            raise CommandError(
                "--worker-id names one process; it cannot be used with --processes > 1."
            )
        worker_options = WorkerOptions(
            queues=tuple(queues),
            concurrency=options["concurrency"],
            lease_seconds=options["lease"],
            shutdown_timeout=options["shutdown_timeout"],
            burst=options["burst"],
            listen=False if options["poll_only"] else None,
            poll_seconds=options["poll"],
            prefetch=options["prefetch"],
            max_jobs=options["max_jobs"],
            worker_id=options["worker_id"],
            cron=not options["no_cron"],
        )
        try:
            config = WorkerConfig.resolve(worker_options)  # Before any fork: one clear refusal.
            if worker_options.cron:
                preflight.check_schedules()
            preflight.wait_for_database(config.database, burst=options["burst"])
        except ConveyorConfigurationError as exc:
            raise CommandError(str(exc)) from exc
        except DatabaseError as exc:  # The database answered, with an error: say it, once.
            raise CommandError(f"Database {config.database!r}: {exc}".strip()) from exc
        exporter = self.exporter(options)
        tune_collector()
        if options["processes"] == 1:
            code = exporter(worker_options, 0)
        else:
            child_options = replace(worker_options, stop_signals=(signal.SIGTERM,), supervised=True)
            code = Supervisor(
                options["processes"],
                lambda slot: exporter(child_options, slot),
                burst=options["burst"],
            ).run()
        sys.exit(code)

    def exporter(self, options: dict[str, Any]) -> Callable[[WorkerOptions, int], int]:
        """How to run the worker of one slot: plain, or serving its metrics first."""
        port = options["metrics_port"]
        if port is None:
            return lambda worker_options, slot: Worker(worker_options).run_to_exit()
        try:
            from django_conveyor.metrics import worker as worker_metrics
        except ImportError as exc:
            raise CommandError(
                f"--metrics-port needs prometheus_client ({exc}). Install the metrics extra: "
                'pip install "django-conveyor[metrics]"'
            ) from exc
        try:
            runner = worker_metrics.slot_runner(
                options["metrics_address"], port, processes=options["processes"]
            )
        except worker_metrics.PortTaken as exc:
            raise CommandError(f"{exc} Choose another --metrics-port.") from exc

        def run(worker_options: WorkerOptions, slot: int) -> int:
            try:
                return runner(worker_options, slot)
            except worker_metrics.PortTaken as exc:  # Taken since the check.
                raise CommandError(f"{exc} Choose another --metrics-port.") from exc

        return run

    def backend_queues(self, alias: str) -> set[str]:
        from django_conveyor.backend import ConveyorBackend
        from django_conveyor.compat import task_backends

        try:
            backend = task_backends[alias]
        except Exception as exc:
            raise CommandError(f"No task backend named {alias!r} in TASKS: {exc}") from exc
        if not isinstance(backend, ConveyorBackend):
            raise CommandError(f"Task backend {alias!r} is not a ConveyorBackend.")
        return set(backend.queues)


# Young collections every 10,000 allocations instead of 700: a job's objects
# mostly die young, freed by their reference counts before a collection
# would look at them.
COLLECT_AFTER_ALLOCATIONS = 10_000


def tune_collector() -> None:
    """Python's cyclic garbage collector, set for a process that runs jobs.

    What is loaded by now (Django, the apps, their settings) lives as long as
    the process: frozen, out of the collector's reach, a full collection no
    longer walks it every few thousand jobs (and, before a fork, no
    collection in a child writes to the pages it shares with its parent).
    Collecting the younger generation less often takes most of what is left.
    """
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(COLLECT_AFTER_ALLOCATIONS, older, oldest)


def configure_logging(verbosity: int) -> None:
    """Give the worker a console handler unless the project configured one."""
    logger = logging.getLogger("django_conveyor")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s %(process)d %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    conveyor_settings()  # Fail early on a bad CONVEYOR setting.
