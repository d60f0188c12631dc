"""`manage.py conveyor_cron list|run NAME|enable NAME|disable NAME`: schedules from a shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_conveyor.conf import conveyor_settings
from django_conveyor.models import Cron, Job
from django_conveyor.periodic import schedules


def _iso(value: Any) -> str:
    return value.isoformat() if value else "-"


class Command(BaseCommand):
    help = "List periodic schedules, run one now, or enable or disable one."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "run", "enable", "disable"])
        parser.add_argument("name", nargs="?", help="The schedule (run, enable, disable).")

    def handle(self, *args: Any, **options: Any) -> None:
        action, name = options["action"], options["name"]
        if action == "list":
            if name:
                raise CommandError("list takes no schedule name.")
            self.list_schedules()
            return
        if not name:
            raise CommandError(f"Name the schedule to {action}.")
        try:
            if action == "run":
                job = schedules.run_now(name)
                self.stdout.write(f"Enqueued job {job.id} for schedule {name!r}.")
                return
            changed = schedules.set_enabled(name, action == "enable")
        except schedules.ScheduleNotFound as exc:
            raise CommandError(str(exc)) from exc
        state = "enabled" if action == "enable" else "disabled"
        self.stdout.write(f"Schedule {name!r} {state}." if changed else f"{name!r} was {state}.")

    def list_schedules(self) -> None:
        for database in conveyor_settings().databases():
            rows = list(Cron.objects.using(database))
            jobs = Job.objects.using(database).filter(pk__in=[r.last_job_id for r in rows])
            states = dict(jobs.values_list("id", "state"))
            for row in rows:
                last_job = (
                    f"job {row.last_job_id} {states.get(row.last_job_id, 'pruned')}"
                    if row.last_job_id
                    else "no job yet"
                )
                self.stdout.write(
                    "\t".join(
                        [
                            row.name,
                            "enabled" if row.enabled else "disabled",
                            "settings" if row.declared else "admin",
                            f"{row.schedule} {row.timezone}",
                            row.task_path,
                            f"queue={row.queue}",
                            f"next={_iso(row.next_tick_at)}",
                            f"last={_iso(row.last_tick_at)}",
                            last_job,
                        ]
                    )
                )
