"""The harness's own PostgreSQL: started, crashed and restarted on demand.

Built on `django_conveyor.embedded` (which finds the binaries and, as root,
runs the server as an unprivileged user); this module adds what only the
harness needs: a server on a TCP port of its choosing, whatever
`DATABASE_URL` says, and an immediate-mode stop (a crash, as far as the
clients can tell: no checkpoint, crash recovery on the next start).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import psycopg

from django_conveyor import embedded

STOP_TIMEOUT_SECONDS = 30.0
# Frozen workers keep their connections (one per handler thread, plus the
# loop's and the listener's) until the end of a run; at 10,000 jobs and 32
# slots `sigstop-atomic` leaves enough of them to exhaust the default 100.
MAX_CONNECTIONS = 400


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(data_dir: Path, port: int) -> None:
    """Start (initdb first if needed) the server of *data_dir* on 127.0.0.1:*port*.

    A new cluster is restarted once with `MAX_CONNECTIONS` (written with
    ALTER SYSTEM, so later restarts of the run keep it).
    """
    embedded.start(data_dir, tcp_port=port)
    with connect(port) as conn:
        current = int(conn.execute("SHOW max_connections").fetchone()[0])
        if current >= MAX_CONNECTIONS:
            return
        conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
    stop(data_dir)
    embedded.start(data_dir, tcp_port=port)


def stop(data_dir: Path, *, immediate: bool = False) -> bool:
    """Stop the server; `immediate` is PostgreSQL's crash-like mode. False if none ran."""
    return embedded.stop(data_dir, timeout=STOP_TIMEOUT_SECONDS, immediate=immediate)


def server_version(data_dir: Path) -> str:
    try:
        return (data_dir / "PG_VERSION").read_text().strip()
    except OSError:
        return "unknown"


def connect(port: int) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=port,
        user=embedded.SUPERUSER,
        dbname=embedded.DATABASE,
        autocommit=True,
        connect_timeout=3,
        application_name="conveyor-faults-harness",
    )


def query(
    port: int, sql: str, params: dict[str, Any] | None = None
) -> list[tuple[Any, ...]] | None:
    """Rows of one statement on a fresh connection; None while the server is away."""
    try:
        with connect(port) as conn:
            return conn.execute(sql, params).fetchall()
    except psycopg.OperationalError:
        return None
