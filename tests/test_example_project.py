"""The example project's demo, end to end, as a user runs it (`--no-serve`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection

from django_conveyor.dbconn import connection_params

REPO = Path(__file__).resolve().parent.parent
DEMO_DB = "conveyor_example_demo"


def database_url(name: str) -> str:
    """DATABASE_URL for database *name* on the suite's server, in django-environ's form."""
    s = connection.settings_dict
    port = s.get("PORT") or 5432
    if not s.get("HOST") or s["HOST"].startswith("/"):
        return f"postgresql://{quote(s['USER'])}@:{port}/{quote(s['HOST'] or '', safe='')}/{name}"
    password = f":{quote(s['PASSWORD'])}" if s.get("PASSWORD") else ""
    return f"postgresql://{quote(s['USER'])}{password}@{s['HOST']}:{port}/{name}"


def admin_connection() -> psycopg.Connection:
    params = connection_params("default")
    params["dbname"] = "postgres"
    return psycopg.connect(**params, autocommit=True)


@pytest.fixture
def demo_database(db):
    with admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DEMO_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DEMO_DB}")
    yield database_url(DEMO_DB)
    with admin_connection() as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DEMO_DB} WITH (FORCE)")


@pytest.mark.slow
def test_demo_reaches_the_expected_states(demo_database):
    env = {**os.environ, "DATABASE_URL": demo_database, "PYTHONUNBUFFERED": "1"}
    env["DJANGO_SETTINGS_MODULE"] = "shop_site.settings"  # pytest-django exported tests.settings
    proc = subprocess.run(
        [sys.executable, "example_project/manage.py", "demo", "--no-serve", "--timeout", "60"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every job ended as expected" in proc.stdout
    assert (
        "3 orders: 3 receipts sent, 3 payments, 3 ledger entries, 3 gateway charges" in proc.stdout
    )
    assert "worker exited with 0" in proc.stdout
    # The demo API key is made once and printed with a curl line that uses it.
    assert "Created the API key 'demo'" in proc.stdout
    key = next(line.split()[-1] for line in proc.stdout.splitlines() if "API key: " in line)
    assert (
        f"curl -sS -X POST http://127.0.0.1:8000/conveyor/api/jobs -H 'Authorization: Bearer {key}'"
        in proc.stdout
    )
    again = subprocess.run(
        [sys.executable, "example_project/manage.py", "demo", "--no-serve", "--orders", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Created the API key" not in again.stdout and f"API key:      {key}" in again.stdout
