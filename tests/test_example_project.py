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
    # The retries the demo shows are expected: one line each, never a traceback. The
    # one traceback is the inventory sync's last attempt, when the job goes dead.
    output = proc.stdout + proc.stderr
    assert output.count("Traceback (most recent call last)") == 1, proc.stderr[-6000:]
    assert "attempt 1 of " in proc.stderr and "retrying at " in proc.stderr
    # Nothing is served, so no URL is printed (issue 21).
    assert "http://" not in proc.stdout
    assert "Created the API key 'demo'" in proc.stdout  # Made once, reused by later runs.
    again = subprocess.run(
        [sys.executable, "example_project/manage.py", "demo", "--no-serve", "--orders", "1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert "Created the API key" not in again.stdout


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
