"""Direct psycopg connections for the worker's own traffic.

The worker's control loop (claim, heartbeat, outcomes, reap) and its
listener use their own autocommit connections, built from the same Django
DATABASES entry, so protocol statements never share a transaction with a
handler and never churn a connection per job.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import psycopg
from django.db import connections
from psycopg.types.json import set_json_loads


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
