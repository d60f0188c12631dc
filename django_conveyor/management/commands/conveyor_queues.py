"""`manage.py conveyor_queues list|pause|resume|limit`: queue control from a shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count, Q

from django_conveyor import limits, operations
from django_conveyor.conf import conveyor_settings
from django_conveyor.models import Job, Queue

ACTOR = "command"  # How limits_changed_by names this command.
NONE = "none"  # The word that removes one limit (`--concurrency none`).
LIMIT_OPTIONS = ("concurrency", "rate", "key_concurrency", "fair")


class Command(BaseCommand):
    help = (
        "List queues with their waiting and running counts and their limits, pause and "
        "resume them, or set their limits (limit NAME --concurrency N --rate N/m ...)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "pause", "resume", "limit"])
        parser.add_argument(
            "queues", nargs="*", help="Queue names (pause and resume); one name for limit."
        )
        limit = parser.add_argument_group("limit", "Options not given keep their current value.")
        limit.add_argument(
            "--concurrency", help=f"Jobs of the queue running at once, at most; '{NONE}': no limit."
        )
        limit.add_argument(
            "--rate", help=f"Starts per second, minute or hour: N/s, N/m or N/h; '{NONE}': no rate."
        )
        limit.add_argument(
            "--key-concurrency",
            help=f"Jobs of one concurrency key running at once, at most; '{NONE}': no limit.",
        )
        limit.add_argument(
            "--fair",
            action="store_const",
            const=True,
            default=None,
            help="Keys take turns (--no-fair: they do not).",
        )
        limit.add_argument("--no-fair", dest="fair", action="store_const", const=False)
        limit.add_argument(
            "--clear", action="store_true", help="Remove every limit (before the options above)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, names = options["action"], options["queues"]
        given = [o for o in LIMIT_OPTIONS if options[o] is not None]
        if options["clear"]:
            given.append("clear")
        if action != "limit" and given:
            flag = "--" + given[0].replace("_", "-")
            raise CommandError(f"{flag} is an option of 'limit', not of '{action}'.")
        if action == "list":
            self.list_queues()
            return
        if not names:
            raise CommandError(f"Name the queue{'' if action == 'limit' else 's'} to {action}.")
        unknown = sorted(set(names) - operations.known_queues())
        if unknown:
            raise CommandError(f"Unknown queue(s): {', '.join(unknown)}.")
        if action == "limit":
            self.limit(names, options)
            return
        changed = operations.pause(names) if action == "pause" else operations.resume(names)
        self.stdout.write(f"{action.capitalize()}d {changed} queue(s).")

    def limit(self, names: list[str], options: dict[str, Any]) -> None:
        if len(names) != 1:
            raise CommandError(f"Name one queue to limit, not {len(names)}.")
        [name] = names
        current = limits.Limits() if options["clear"] else limits.current(name)
        values = current.declared()
        try:
            for option in ("concurrency", "key_concurrency"):
                if options[option] is not None:
                    values[option] = _count(options[option], where=f"--{_flag(option)}")
            if options["rate"] is not None:
                text = options["rate"]
                values["rate"] = None if text.strip().lower() == NONE else text
                limits.parse_rate(values["rate"], where="--rate")
        except limits.InvalidLimit as exc:
            raise CommandError(str(exc)) from None
        if options["fair"] is not None:
            values["fair"] = options["fair"]
        wanted = limits.from_mapping(values, where=name)
        before, after = limits.set_limits(name, wanted, actor=ACTOR)
        self.stdout.write(f"{name}: limits {before.describe()} -> {after.describe()}")

    def list_queues(self) -> None:
        paused: set[str] = set()
        limited: dict[str, limits.Limits] = {}
        counts: dict[str, dict[str, int]] = {}
        for database in conveyor_settings().databases():
            for queue in Queue.objects.using(database):
                if queue.paused:
                    paused.add(queue.name)
                limited[queue.name] = limits.of(queue)
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
            described = limited.get(name, limits.Limits()).describe()
            self.stdout.write(
                f"{name}\t{flag}\twaiting={row['waiting']}\trunning={row['running']}"
                f"\tlimits={described}"
            )


def _flag(option: str) -> str:
    return option.replace("_", "-")


def _count(text: str, *, where: str) -> int | None:
    """A limit of jobs at once from the command line: a whole number, or the word none."""
    if text.strip().lower() == NONE:
        return None
    return limits.count_from_text(text, where=where, blank_is_none=False)
