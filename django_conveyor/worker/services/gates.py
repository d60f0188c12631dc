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
   CONDITION_MET ends the ones a row matches (`check_conditions` in
   workflows/conditions.py, which a new workflow also runs for its gates
   that wait at once). A condition that cannot be
   evaluated (its model or field is gone) fails its own gate with a
   `ConditionInvalid` entry, never the pass.

A pass with nothing to do costs two index probes.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from django.db import connections

from ... import protocol
from ...conf import DEFAULT_GATES_SECONDS
from ...protocol import Cursor
from ...workflows.conditions import CONDITION_BATCH, check_conditions
from .base import Now, transaction_of

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = DEFAULT_GATES_SECONDS  # CONVEYOR["GATES_SECONDS"]: a timer's lateness.
BATCH = 500  # Due gates ended per pass, at most: a short statement, even after an outage.


class GateCounts(NamedTuple):
    gates_timed_out: int = 0  # Timers and timeouts ended (completed or failed).
    conditions_checked: int = 0
    conditions_met: int = 0  # Completed; or failed, their condition invalid.


def _close(connection: Any) -> None:
    if not connection.in_atomic_block:  # A caller's transaction (a test's) is left alone.
        connection.close()


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
        with transaction_of(cursor):
            ended = protocol.gate_timeout(cursor, limit=self.batch)
        for gate in ended:
            logger.info("gate %s (%s, queue %s): deadline passed -> %s",
                        gate.id, gate.task_path, gate.queue, gate.state)  # fmt: skip
        try:
            checked = check_conditions(self.database, after=self.after, limit=self.condition_batch)
        except Exception:
            # Django's connection is not the loop's, which the loop renews: it
            # may be broken, or on a server that takes no writes (a fenced
            # primary, after a failover). The next pass opens a new one.
            _close(connections[self.database])
            raise
        self.after = checked.last_id
        return GateCounts(len(ended), checked.checked, checked.ended)
