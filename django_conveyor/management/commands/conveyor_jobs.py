"""`manage.py conveyor_jobs requeue|cancel`: the operator's actions from a shell.

Selects jobs by id, by state, queue and task, or by a search (the admin's
syntax, docs/observability.md#search), then changes them through the same
operations (and so the same protocol statements) as the admin.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_conveyor import operations
from django_conveyor.conf import conveyor_settings
from django_conveyor.management.arguments import storable
from django_conveyor.models import Job, unique_key_is
from django_conveyor.observability import search
from django_conveyor.states import CANCELLABLE_STATES, REQUEUEABLE_STATES
from django_conveyor.tasks import known_task_paths
from django_conveyor.unique import KEY_FORMAT

ACTIONS = {
    "requeue": (operations.requeue, REQUEUEABLE_STATES),
    "cancel": (operations.cancel, CANCELLABLE_STATES),
}


def id_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise CommandError(f"--ids takes comma-separated job ids, not {text!r}.") from None


def search_terms(text: str) -> search.Search:
    try:
        found = search.parse(text)
    except search.InvalidSearch as exc:
        raise CommandError(f"--search: {exc}") from None
    if not found:
        raise CommandError("--search needs at least one term, not an empty string.")
    return found


def unique_key(text: str) -> str:
    if not KEY_FORMAT.fullmatch(text):
        raise CommandError(
            f"--unique-key takes a job's unique key (64 lowercase hex digits), not {text!r}."
        )
    return text


class Command(BaseCommand):
    help = "Requeue failed, dead or cancelled jobs, or cancel jobs that have not started."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=sorted(ACTIONS))
        parser.add_argument("--ids", type=id_list, default=None, help="Comma-separated job ids.")
        parser.add_argument("--state", default=None, help="Only jobs in this state.")
        parser.add_argument("--queue", type=storable, default=None, help="Only jobs of this queue.")
        parser.add_argument(
            "--task", type=storable, default=None, help="Only jobs of this task path."
        )
        parser.add_argument(
            "--search",
            type=search_terms,
            default=None,
            help="Only jobs this search finds (the admin's syntax: 'tag:tenant:42 meta.batch:7').",
        )
        parser.add_argument(
            "--unique-key", type=unique_key, default=None, help="Only jobs of this unique key."
        )
        parser.add_argument(
            "--database", default=None, help="Alias (default CONVEYOR['DATABASE'])."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Show the count, change nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, allowed = ACTIONS[options["action"]]
        database = options["database"] or conveyor_settings().DATABASE
        if options["state"] and options["state"] not in allowed:
            names = ", ".join(sorted(allowed))
            raise CommandError(
                f"Cannot {options['action']} jobs in state {options['state']!r}; "
                f"choose one of: {names}."
            )
        if not any(options[k] for k in ("ids", "state", "queue", "task", "search", "unique_key")):
            raise CommandError(
                "Select jobs with --ids, --state, --queue, --task, --search or --unique-key."
            )
        jobs = Job.objects.using(database).filter(
            state__in=[options["state"]] if options["state"] else list(allowed)
        )
        if options["ids"]:
            jobs = jobs.filter(pk__in=options["ids"])
        if options["queue"]:
            jobs = jobs.filter(queue=options["queue"])
        if options["task"]:
            jobs = jobs.filter(task_path=options["task"])
        if options["search"]:
            # Unbounded, unlike the admin's window: an action must not skip
            # older jobs it was asked for (--dry-run shows the count first).
            sql, params = options["search"].where(known_task_paths())
            jobs = jobs.extra(where=[sql], params=params)
        if options["unique_key"]:
            jobs = jobs.filter(unique_key_is(options["unique_key"]))
        ids = list(jobs.values_list("id", flat=True))
        if options["dry_run"]:
            self.stdout.write(f"Would {options['action']} {len(ids)} job(s).")
            return
        changed = action(ids, database=database, actor="cli")
        verb = {"requeue": "Requeued", "cancel": "Cancelled"}[options["action"]]
        self.stdout.write(f"{verb} {len(changed)} job(s).")
        if options["action"] == "requeue" and len(changed) < len(ids):
            left = sorted(set(ids) - set(changed))
            for job_id, (holder, state) in sorted(
                operations.key_holders(left, database=database).items()
            ):
                self.stderr.write(
                    f"Job {job_id} was not requeued: its unique key is held by job {holder} "
                    f"({state}). Cancel that job, or wait for it to finish, then requeue."
                )
