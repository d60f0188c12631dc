"""The example project's demo, end to end, as a user runs it (`--no-serve`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, scratch_database

DEMO_DB = "conveyor_example_demo"


@pytest.fixture
def demo_database(db):
    with scratch_database(DEMO_DB) as url:
        yield url


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
    assert "3 orders fulfilled, each after its charge, receipt and stock update" in proc.stdout
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


@pytest.mark.slow
def test_the_example_projects_own_tests_pass(db):
    with scratch_database("conveyor_example_tests") as url:
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "shop_site.settings"}
        proc = subprocess.run(
            [sys.executable, "example_project/manage.py", "test", "shop", "--noinput", "-v", "2"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Ran 4 tests" in proc.stderr and "OK" in proc.stderr
