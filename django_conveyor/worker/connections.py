"""The worker's own psycopg connections: the control loop's, and the one that listens.

The worker's control loop (claim, heartbeat, outcomes, reap) and its
listener use their own autocommit connections, built from the same Django
DATABASES entry, so protocol statements never share a transaction with a
handler and never churn a connection per job.

The `Listener` wakes an idle worker when a job is enqueued in one of its
queues. NOTIFY is an optimisation, never the correctness mechanism: a lost
notification only costs up to one poll interval, so its errors are logged
and it reconnects while the worker keeps polling.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections
from psycopg.types.json import set_json_loads

from ..protocol import NOTIFY_CHANNEL
from .backoff import LISTENER_RECONNECT_SECONDS, Ladder

logger = logging.getLogger(__name__)

# SQLSTATE read_only_sql_transaction: a standby, or a primary demoted or fenced
# read-only. The connection works but takes no writes: drop it and connect
# again (libpq's target_session_attrs=read-write then skips such a server).
READ_ONLY_SQLSTATE = "25006"
READ_ONLY = "database is read-only (a standby or a demoted primary?)"


def is_read_only(exc: BaseException) -> bool:
    """exc, or the psycopg error Django wrapped in it, says the server takes no writes."""
    error = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return isinstance(error, psycopg.Error) and error.sqlstate == READ_ONLY_SQLSTATE


def one_line(exc: BaseException) -> str:
    """An error's text on one line (libpq gives each host of a list a line of its own)."""
    return "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())


def connection_params(alias: str) -> dict[str, Any]:
    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context", "server_side_binding", "pool"):
        params.pop(django_only, None)
    params.setdefault("application_name", "django-conveyor")
    return params


def connect(alias: str, *, dsn: str | None = None, prepare: bool = True) -> psycopg.Connection:
    """An autocommit connection; `prepare=False` for poolers without prepared statements."""
    if dsn:
        conn = psycopg.connect(dsn, autocommit=True)
    else:
        conn = psycopg.connect(**connection_params(alias), autocommit=True)
    conn.prepare_threshold = 2 if prepare else None
    set_json_loads(_loads, conn)
    return conn


def _loads(data: bytes) -> Any:
    # json.loads() of bytes first sniffs for UTF-16 and UTF-32, which PostgreSQL never sends.
    return json.loads(data.decode())


class LoopConnection:
    """The control loop's own connection: opened on demand, dropped on any doubt."""

    def __init__(self, alias: str, *, prepare: bool) -> None:
        self.alias = alias
        self.prepare = prepare
        self.conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.alias, prepare=self.prepare)
        return self.conn

    def drop(self) -> None:
        """Close it; the next get() reconnects (pending outcomes are written again, fenced)."""
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None


class Listener(threading.Thread):
    def __init__(
        self,
        *,
        database: str,
        dsn: str | None,
        queues: frozenset[str],
        wake: Callable[[], None],
        stopping: threading.Event,
    ) -> None:
        super().__init__(name="conveyor-listener", daemon=True)
        self.database = database
        self.dsn = dsn
        self.queues = queues
        self.wake = wake
        self.stopping = stopping
        self.notifications = 0

    def run(self) -> None:
        backoff = Ladder(LISTENER_RECONNECT_SECONDS)
        while not self.stopping.is_set():
            try:
                self.listen()
                backoff.reset()
            except psycopg.Error as exc:
                delay = backoff.next_delay()
                why = READ_ONLY if is_read_only(exc) else one_line(exc)
                logger.warning("listener lost its connection (%s); retrying in %.1fs", why, delay)
                self.wake()  # Anything may have been enqueued meanwhile: poll now.
                self.stopping.wait(delay)

    def listen(self) -> None:
        with connect(self.database, dsn=self.dsn, prepare=False) as conn:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            logger.debug("listening on channel %s", NOTIFY_CHANNEL)
            self.wake()
            while not self.stopping.is_set():
                for notify in conn.notifies(timeout=1.0):
                    if notify.payload in self.queues:
                        self.notifications += 1
                        self.wake()
                    if self.stopping.is_set():
                        return
                time.sleep(0)  # Let the GIL go between bursts.
