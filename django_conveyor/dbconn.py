"""Direct psycopg connections for the worker's own traffic.

The worker's control loop (claim, heartbeat, outcomes, reap) and its
listener use their own autocommit connections, built from the same Django
DATABASES entry, so protocol statements never share a transaction with a
handler and never churn a connection per job.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections


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
    return conn
