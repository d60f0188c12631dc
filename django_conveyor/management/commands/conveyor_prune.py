"""`manage.py conveyor_prune`: delete finished jobs older than the retention window.

Deletes in small batches (each its own transaction, skipping locked rows) so
pruning a large history never holds long locks on the claim path.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections, transaction
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now

from django_conveyor import protocol
from django_conveyor.conf import conveyor_settings
from django_conveyor.management.arguments import non_negative_seconds, positive_int, queue_list
from django_conveyor.models import Job
from django_conveyor.states import FINAL_STATES

DEFAULT_BATCH_SIZE = 1000


class Command(BaseCommand):
    help = "Delete completed, failed, dead and cancelled jobs older than the retention window."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--older-than", type=non_negative_seconds, default=None,
            help="Seconds since a job finished (default CONVEYOR['RETENTION_SECONDS']).",
        )  # fmt: skip
        parser.add_argument("--queues", type=queue_list, default=None, help="Only these queues.")
        parser.add_argument(
            "--database", default=None, help="Alias to prune (default: every conveyor database)."
        )
        parser.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE)
        parser.add_argument("--dry-run", action="store_true", help="Count, delete nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        settings = conveyor_settings()
        older_than = (
            settings.RETENTION_SECONDS if options["older_than"] is None else options["older_than"]
        )
        databases = [options["database"]] if options["database"] else settings.databases()
        unknown = [d for d in databases if d not in connections.settings]
        if unknown:
            raise CommandError(f"Unknown database alias {unknown[0]!r}.")
        total = 0
        for database in databases:
            # The queues with finished jobs (only those are pruned): a read of
            # the list index, which leaves running rows out.
            queues = options["queues"] or list(
                Job.objects.using(database)
                .filter(state__in=list(FINAL_STATES))
                .order_by()
                .values_list("queue", flat=True)
                .distinct()
            )
            if options["dry_run"]:
                total += self.count(database, queues, older_than)
                continue
            while True:
                with transaction.atomic(using=database), connections[database].cursor() as cursor:
                    deleted = protocol.prune(
                        cursor,
                        older_than_seconds=older_than,
                        queues=queues,
                        limit=options["batch_size"],
                    )
                total += deleted
                if deleted < options["batch_size"]:
                    break
        verb = "Would delete" if options["dry_run"] else "Deleted"
        self.stdout.write(f"{verb} {total} finished job(s) older than {older_than:g}s.")

    def count(self, database: str, queues: list[str], older_than: float) -> int:
        """What PRUNE would delete, judged by the database's clock as PRUNE is."""
        cutoff = ExpressionWrapper(
            Now() - timedelta(seconds=older_than), output_field=DateTimeField()
        )
        return (
            Job.objects.using(database)
            .filter(state__in=list(FINAL_STATES), queue__in=queues, finished_at__lt=cutoff)
            .count()
        )
