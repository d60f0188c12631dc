"""What `conveyor_worker` makes sure of before it starts a worker, even with --skip-checks.

A worker that cannot work should say why once and exit 1, not loop logging
the same error: its database must be PostgreSQL (conveyor.E020) and have
the conveyor tables at the installed migrations, and every schedule of
`CONVEYOR["CRON"]` it would run must be valid (the system check's
messages). A database that does not answer is waited for, as the control
loop would (a worker may start before its database); a `--burst` worker
waits at most `BURST_GIVE_UP_SECONDS`, then exits 1.
"""

from __future__ import annotations

import logging
import time

from django.db import OperationalError, connections
from django.db.migrations.loader import MigrationLoader

from ..conf import not_postgresql
from ..exceptions import ConveyorConfigurationError
from ..periodic.schedules import check_cron
from .backoff import WORKER_RECONNECT_SECONDS, Ladder

logger = logging.getLogger(__name__)

APP_LABEL = "conveyor"
BURST_GIVE_UP_SECONDS = 30.0  # A --burst worker without a database for this long exits 1.


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class WorkerCannotStart(ConveyorConfigurationError):
    """The worker's database or settings leave it nothing it could do."""


def migrate_hint(database: str) -> str:
    flag = "" if database == "default" else f" --database {database}"
    return f"run `manage.py migrate{flag}` first"


def unapplied(database: str) -> list[str]:
    """The conveyor migrations the installed code has and `database` has not applied."""
    loader = MigrationLoader(connections[database], ignore_no_migrations=True)
    plan = [
        node
        for leaf in loader.graph.leaf_nodes(APP_LABEL)
        for node in loader.graph.forwards_plan(leaf)
        if node[0] == APP_LABEL
    ]
    return [
        name for app, name in dict.fromkeys(plan) if (app, name) not in loader.applied_migrations
    ]


def check_database(database: str) -> None:
    """PostgreSQL, and migrated; raises WorkerCannotStart saying what to do."""
    connection = connections[database]
    if connection.vendor != "postgresql":
        engine = connection.settings_dict.get("ENGINE", "")
        raise WorkerCannotStart(f"{not_postgresql(database, engine)} Point it at PostgreSQL 14+.")
    missing = unapplied(database)
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise WorkerCannotStart(
            f"Database {database!r} lacks {len(missing)} conveyor migration(s) ({shown}): "
            f"{migrate_hint(database)}."
        )
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('conveyor_job') IS NOT NULL")
        if not cursor.fetchone()[0]:
            raise WorkerCannotStart(
                f"Database {database!r} has no conveyor_job table although its migrations are "
                f"recorded: {migrate_hint(database)} (or migrate conveyor zero, then again)."
            )


def check_schedules() -> None:
    """Every CONVEYOR["CRON"] entry valid, as the system check says (also without checks)."""
    problems = [message.msg for message in check_cron()]
    if problems:
        raise WorkerCannotStart(" ".join(problems) + " Fix or remove the schedule.")


def wait_for_database(database: str, *, burst: bool) -> None:
    """`check_database`, retried while the database does not answer (bounded with burst)."""
    ladder = Ladder(WORKER_RECONNECT_SECONDS)
    first_failure: float | None = None
    while True:
        try:
            check_database(database)
            return
        except OperationalError as exc:  # It does not answer; other errors are its answer.
            connections[database].close()
            reason = first_line(exc)
            now = time.monotonic()
            first_failure = now if first_failure is None else first_failure
            if burst and now - first_failure >= BURST_GIVE_UP_SECONDS:
                raise WorkerCannotStart(
                    f"Database {database!r} did not answer for {BURST_GIVE_UP_SECONDS:.0f}s "
                    f"({reason}): a --burst worker gives up."
                ) from None
            delay = ladder.next_delay()
            logger.warning(
                "database %r unavailable (%s); retrying in %.1fs", database, reason, delay
            )
            time.sleep(delay)
        finally:
            connections[database].close()  # Never inherited across fork, never kept idle.
