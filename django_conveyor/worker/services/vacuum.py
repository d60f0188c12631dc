"""The vacuum service: the job table's dead row versions, removed as the workers go.

Every claim and completion of a job leaves a dead version of its row (none
can be a HOT update: each changes `state`, which the partial indexes read).
Autovacuum looks at a database once per `autovacuum_naptime`, a server-wide
setting (60 s by default) that no table can lower, so a queue draining
10,000 jobs a second carries more than a million dead versions between its
passes, and its claims, completions and enqueues slow down as they pile up
(docs/performance.md, "The job table under a sustained load").

So every CHECK_SECONDS a worker reads the table's count of dead versions on
its control connection (one call of a statistics function) and, past
CONVEYOR["VACUUM_DEAD_ROWS"], runs `VACUUM (SKIP_LOCKED) conveyor_job` in a
thread, on a connection opened for the pass: the control loop never waits
for it, and a worker holds no extra connection between passes. A vacuum
changes nothing any statement can see; stopping it midway (a shutdown, a
statement_timeout) keeps what it did.

The fleet's passes go one at a time without coordination: a worker that
sees a pass of its role under way (`pg_stat_progress_vacuum`) does not
start one, and SKIP_LOCKED makes a pass that still meets another (or
autovacuum's) skip the table at once. Looks are jittered by a quarter, so
that workers started together do not look together.

Only the table's owner (or the database's, or a superuser) may vacuum it:
a worker whose role may not says so once and stops looking. When a pass
leaves the count past the threshold (a transaction older than the dead
versions still needs them, or another pass held the table), or fails, the
next look waits twice as long, up to MAX_WAIT_SECONDS.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from typing import Any, NamedTuple

import psycopg

from ...protocol import Cursor
from ..connections import connect, one_line
from .base import Now

logger = logging.getLogger(__name__)

TABLE = "conveyor_job"
CHECK_SECONDS = 2.0  # How often a worker reads the count of dead versions.
MAX_WAIT_SECONDS = 60.0  # The longest wait after passes that could not bring it down.
STOP_SECONDS = 5.0  # How long a stopping worker waits for a cancelled pass to end.

_DEAD = f"coalesce(pg_stat_get_dead_tuples(to_regclass('{TABLE}')), 0)"
DEAD_ROWS = f"SELECT {_DEAD}"
# A look: the count, and whether a pass of this role is under way already (the
# progress of other roles' passes, autovacuum's among them, is hidden from it).
LOOK = f"""
SELECT {_DEAD},
       EXISTS (SELECT 1 FROM pg_stat_progress_vacuum WHERE relid = to_regclass('{TABLE}'))
"""

# What PostgreSQL 14 to 16 let vacuum a table: owning it (or being a member of
# a role that does), owning the database, or being a superuser (who is a
# member of every role).
MAY_VACUUM = f"""
SELECT pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE')
FROM pg_class AS c, pg_database AS d
WHERE c.oid = to_regclass('{TABLE}') AND d.datname = current_database()
"""
# PostgreSQL 17 adds the MAINTAIN privilege (and the pg_maintain role).
MAY_VACUUM_17 = f"{MAY_VACUUM.rstrip()} OR has_table_privilege(c.oid, 'MAINTAIN')\n"

VACUUM = f"VACUUM (SKIP_LOCKED) {TABLE}"
LOCK_NOT_AVAILABLE = "55P03"  # SKIP_LOCKED's warning: another pass holds the table.


def may_vacuum(conn: psycopg.Connection) -> bool:
    """Whether the connection's role may vacuum the job table."""
    may = MAY_VACUUM_17 if conn.info.server_version >= 170000 else MAY_VACUUM
    row = conn.execute(may).fetchone()
    return bool(row and row[0])


def dead_rows(cursor: Cursor) -> int:
    cursor.execute(DEAD_ROWS)
    return int(cursor.fetchall()[0][0])


def jittered(seconds: float) -> float:
    """A wait give or take a quarter, so that workers started together do not look together."""
    return seconds * random.uniform(0.75, 1.25)


class VacuumCounts(NamedTuple):
    vacuum_passes: int = 0  # Passes this look started (0 or 1).


class VacuumService:
    name = "vacuum"
    while_draining = False

    def __init__(self, *, database: str, dead_rows: int, interval: float = CHECK_SECONDS) -> None:
        self.database = database
        self.dead_rows = dead_rows
        self.interval = interval
        self.next_due = 0.0  # time.monotonic() of the next look.
        self.allowed: bool | None = None  # Learnt on the first pass.
        self.wait = interval
        self.pass_thread: threading.Thread | None = None
        self.pass_conn: psycopg.Connection | None = None

    def run_once(self, cursor: Cursor, now: Now) -> VacuumCounts:
        self.next_due = now.monotonic + jittered(self.wait)
        if self.allowed is False or self.running():
            return VacuumCounts()
        cursor.execute(LOOK)
        ((before, under_way),) = cursor.fetchall()
        if before < self.dead_rows or under_way:  # A fleet's passes, one at a time.
            return VacuumCounts()
        self.pass_thread = threading.Thread(
            target=self.vacuum, args=(before,), name="conveyor-vacuum", daemon=True
        )
        self.pass_thread.start()
        return VacuumCounts(vacuum_passes=1)

    def running(self) -> bool:
        return self.pass_thread is not None and self.pass_thread.is_alive()

    def vacuum(self, before: int) -> None:
        """One pass, on a connection of its own (the pass thread)."""
        skipped: list[str] = []
        started = time.monotonic()
        try:
            with connect(self.database, prepare=False) as conn:
                self.pass_conn = conn
                if self.allowed is None:
                    self.allowed = may_vacuum(conn)
                    if not self.allowed:
                        logger.info(
                            "workers do not vacuum %s: role %s may not (only its owner may); "
                            "autovacuum alone removes its dead row versions",
                            TABLE, conn.info.user,
                        )  # fmt: skip
                        return

                def on_notice(notice: psycopg.errors.Diagnostic) -> None:
                    if notice.sqlstate == LOCK_NOT_AVAILABLE:
                        skipped.append(notice.message_primary or "")

                conn.add_notice_handler(on_notice)
                conn.execute(VACUUM)
                after = dead_rows(conn.cursor())
        except Exception as exc:  # A thread of its own: nothing above it would say why.
            self.look_later(longer=True)
            logger.warning(
                "vacuum of %s failed (%s: %s); next look in %.0fs",
                TABLE, type(exc).__name__, one_line(exc), self.wait,
            )  # fmt: skip
            return
        finally:
            self.pass_conn = None
        # Past the threshold still: what is dead is still needed (a long
        # transaction?), or another pass holds the table; looking again soon
        # would only repeat this.
        self.look_later(longer=after >= self.dead_rows)
        logger.debug(
            "%s %s in %.2fs: %d dead row versions before, %d after; next look in %.0fs",
            "skipped (another pass holds it)" if skipped else "vacuumed",
            TABLE, time.monotonic() - started, before, after, self.wait,
        )  # fmt: skip

    def look_later(self, *, longer: bool) -> None:
        """The next look: after twice the last wait (up to MAX_WAIT_SECONDS), or as usual."""
        self.wait = min(self.wait * 2, MAX_WAIT_SECONDS) if longer else self.interval
        self.next_due = time.monotonic() + jittered(self.wait)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """Cancel a pass under way (what it did is kept) and wait for its thread."""
        conn, thread = self.pass_conn, self.pass_thread
        if conn is not None and not conn.closed:
            cancel: Any = getattr(conn, "cancel_safe", conn.cancel)
            with contextlib.suppress(psycopg.Error):
                cancel()
        if thread is not None:
            thread.join(timeout)
