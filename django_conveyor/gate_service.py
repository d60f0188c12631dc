"""The gates service: fire timers and timeouts, and check row conditions.

Every worker runs it, so gates keep moving while any worker does, with no
leader. Each pass, in the worker's database:

1. GATE_TIMEOUT ends up to BATCH gates whose deadline passed
   (`gate_deadline <= now()`, the database's clock), through the partial
   index on `gate_deadline`, skipping rows another transaction holds (a
   signal that is ending the same gate). A timer completes; a timeout
   completes with its marker (`on_timeout="continue"`) or fails.
2. The waiting `wait_until` gates are checked in turn, CONDITION_BATCH per
   pass: the service keeps its place (the last id it checked) and wraps
   around, so every waiting condition is reached. Each is locked (FOR UPDATE
   SKIP LOCKED), its condition evaluated with the ORM in a savepoint, and
   CONDITION_MET ends the ones a row matches. A condition that cannot be
   evaluated (its model or field is gone) fails its own gate with a
   `ConditionInvalid` entry, never the pass.

A pass with nothing to do costs two index probes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.core.exceptions import FieldError
from django.db import DatabaseError, connections, transaction

from . import protocol
from .conditions import first_match
from .protocol import Cursor
from .services import Now

logger = logging.getLogger("django_conveyor.gates")

DEFAULT_INTERVAL_SECONDS = 1.0  # CONVEYOR["GATES_SECONDS"]: how late a timer may fire.
BATCH = 500  # Due gates ended per pass, at most: a short statement, even after an outage.
CONDITION_BATCH = 100  # Waiting conditions checked per pass and worker.

# Waiting condition gates in id order, after the last one checked
# (conveyor_job_gate_waiting_idx), or the ones named.
WAITING_CONDITIONS = """
SELECT id, gate FROM conveyor_job
WHERE state = 'blocked' AND gate IS NOT NULL AND (gate ->> 'kind') = 'condition'
  AND pending_dependencies = 0 AND id > %(after)s
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""


class GateCounts(NamedTuple):
    gates_timed_out: int = 0  # Timers and timeouts ended (completed or failed).
    conditions_checked: int = 0
    conditions_met: int = 0  # Completed; or failed, their condition invalid.


class Checked(NamedTuple):
    checked: int
    ended: int
    last_id: int  # The last gate checked, when the batch was full; else 0 (wrap around).


def check_conditions(
    database: str, *, after: int = 0, limit: int = CONDITION_BATCH, ids: Sequence[int] | None = None
) -> Checked:
    """Check waiting conditions (those after `after`, or `ids`) and end the met ones.

    Runs in a transaction (a savepoint inside the caller's) on Django's
    connection to `database`, where the conditions' models are read.
    """
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        cursor.execute(
            WAITING_CONDITIONS,
            {"after": after, "limit": limit, "ids": list(ids) if ids is not None else None},
        )
        waiting = cursor.fetchall()
        rows = []
        for gate_id, gate in waiting:
            stored = protocol._loaded(gate)["condition"]
            try:
                with transaction.atomic(using=database):
                    matched = first_match(stored, using=database)
            except (LookupError, FieldError, DatabaseError, ValueError, TypeError, KeyError) as exc:
                logger.warning("gate %s: its condition on %s failed: %s", gate_id,
                               stored.get("model"), exc)  # fmt: skip
                rows.append({"id": gate_id, "matched": None, "error": _error_text(stored, exc)})
                continue
            if matched is not None:
                rows.append({"id": gate_id, "matched": _json_pk(matched), "error": None})
        ended = protocol.condition_met(cursor, rows=rows)
    last = waiting[-1][0] if len(waiting) == limit else 0
    return Checked(len(waiting), len(ended), last)


def _json_pk(pk: Any) -> Any:
    return pk if isinstance(pk, int | str) else str(pk)  # A UUID, say.


def _error_text(stored: dict[str, Any], exc: Exception) -> str:
    return (
        f"The condition on {stored.get('model')} could not be evaluated: "
        f"{type(exc).__name__}: {exc}"
    )[:2000]


def _transaction(cursor: Any) -> Any:
    django_connection = getattr(cursor, "db", None)
    if django_connection is not None:  # A Django cursor (tests, `testing.py`).
        return transaction.atomic(using=django_connection.alias)
    return cursor.connection.transaction()  # The worker's autocommit psycopg connection.


class GatesService:
    name = "gates"
    while_draining = False

    def __init__(
        self,
        *,
        database: str,
        interval: float = DEFAULT_INTERVAL_SECONDS,
        batch: int = BATCH,
        condition_batch: int = CONDITION_BATCH,
    ) -> None:
        self.database = database
        self.interval = interval
        self.batch = batch
        self.condition_batch = condition_batch
        self.after = 0  # The last condition gate checked: the next pass goes on from there.

    def run_once(self, cursor: Cursor, now: Now) -> GateCounts:
        # One transaction: the gates' ends and their dependents' (UNBLOCK,
        # CANCEL_DEPENDENTS) commit together. The conditions need the ORM, so
        # they run on Django's connection of the same database.
        with _transaction(cursor):
            ended = protocol.gate_timeout(cursor, limit=self.batch)
        for gate in ended:
            logger.info("gate %s (%s, queue %s): deadline passed -> %s",
                        gate.id, gate.task_path, gate.queue, gate.state)  # fmt: skip
        checked = check_conditions(self.database, after=self.after, limit=self.condition_batch)
        self.after = checked.last_id
        return GateCounts(len(ended), checked.checked, checked.ended)
