"""`manage.py conveyor_queues list|pause|resume`: queue control from a shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Q

from django_conveyor import operations
from django_conveyor.conf import conveyor_settings
from django_conveyor.models import Job, Queue


class Command(BaseCommand):
    help = "List queues with their waiting and running counts, or pause and resume them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "pause", "resume"])
        parser.add_argument("queues", nargs="*", help="Queue names (pause and resume).")

    def handle(self, *args: Any, **options: Any) -> None:
        action, names = options["action"], options["queues"]
        if action == "list":
            self.list_queues()
            return
        if not names:
            raise CommandError(f"Name the queues to {action}.")
        unknown = sorted(set(names) - operations.known_queues())
        if unknown:
            raise CommandError(f"Unknown queue(s): {', '.join(unknown)}.")
        changed = operations.pause(names) if action == "pause" else operations.resume(names)
        self.stdout.write(f"{action.capitalize()}d {changed} queue(s).")

    def list_queues(self) -> None:
        paused: set[str] = set()
        counts: dict[str, dict[str, int]] = {}
        for database in conveyor_settings().databases():
            queues = Queue.objects.using(database).filter(paused=True)
            paused |= set(queues.values_list("name", flat=True))
            rows = (
                Job.objects.using(database)
                .values("queue")
                .annotate(
                    waiting=Count("id", filter=Q(state="available")),
                    running=Count("id", filter=Q(state="running")),
                )
            )
            counts.update({row["queue"]: row for row in rows})
        for name in sorted(operations.known_queues() | set(counts)):
            row = counts.get(name, {"waiting": 0, "running": 0})
            flag = "paused" if name in paused else "active"
            self.stdout.write(f"{name}\t{flag}\twaiting={row['waiting']}\trunning={row['running']}")
