"""Shared by the API benchmarks: scratch databases on the suite's server, and the results."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[2]


def setup_django(database: str, shard: str | None = None) -> None:
    """Django on the suite's settings, pointed at a scratch database (and shard) of its own."""
    import os

    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["CONVEYOR_DB_NAME"] = database
    if shard:
        os.environ["CONVEYOR_SHARD_DB_NAME"] = shard
    import django

    django.setup()


def start_worker(log: IO[bytes], **env: str) -> subprocess.Popen[bytes]:
    """One `conveyor_worker` of the default queue on the scratch database, in a session of its own.

    `env` adds to this process's environment (the scratch database's name is there already).
    """
    return subprocess.Popen(
        [sys.executable, "-m", "django", "conveyor_worker", "--queues", "default", "-v", "1"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def admin_sql(*statements: str) -> None:
    """Run statements on the server's `postgres` database (create or drop databases)."""
    import psycopg
    from django.db import connections

    from django_conveyor.worker.connections import connection_params

    connections.close_all()
    params = connection_params("default")
    params["dbname"] = "postgres"
    with psycopg.connect(**params, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def recreate(*names: str) -> None:
    for name in names:
        admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name}")


@contextlib.contextmanager
def migrated(database: str, shard: str | None = None) -> Iterator[None]:
    """Django on the suite's settings, on a new scratch database (and shard), migrated;
    both dropped when the block ends."""
    setup_django(database, shard)
    from django.core.management import call_command

    names = (database, shard) if shard else (database,)
    recreate(*names)
    try:
        call_command("migrate", verbosity=0)
        yield
    finally:
        drop(*names)


def drop(*names: str) -> None:
    for name in names:
        admin_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def report(result: dict[str, Any], out: Path | None, stem: str) -> None:
    """Print the result, and write it to `out/<stem>-<date>.json` when asked."""
    path = out / f"{stem}-{result['date']}.json" if out else None
    emit(result, path)
    if path:
        print(f"wrote {path}", file=sys.stderr)


def emit(result: dict[str, Any], path: Path | None) -> None:
    """Print the result, and write it to the file `path` when asked."""
    print(json.dumps(result, indent=2))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
