import subprocess

import pytest
from django.conf import settings
from django.db import connection

from django_conveyor.conf import conveyor_settings
from django_conveyor.models import Job
from tests.helpers import clear_task_caches, kill_group
from tests.pgbouncer.bouncer import is_session_state_error

pytest_plugins = ["django_conveyor.testing"]  # The `conveyor` fixture, as a project uses it.


@pytest.fixture(autouse=True)
def _fresh_task_caches():
    clear_task_caches()
    yield


@pytest.fixture
def cur():
    """A cursor of the test database's Django connection, for running statements directly."""
    with connection.cursor() as cursor:
        yield cursor


@pytest.fixture
def procs():
    """Processes a test starts; whatever is left of them is killed afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        kill_group(proc)


@pytest.fixture(autouse=True)
def _no_session_state_errors(request):
    """Behind PgBouncer, fail a test that met a session-state error anywhere.

    In-process workers log database errors and carry on, and a handler's
    error is recorded on its job, not raised, so such an error would not
    fail the test by itself. Checked before the test's tables are flushed.
    """
    if not getattr(settings, "POOLER", None):
        yield
        return
    caplog = request.getfixturevalue("caplog")
    yield
    texts = [caplog.text]
    if marker := request.node.get_closest_marker("django_db"):
        allowed = marker.kwargs.get("databases") or ["default"]
        for alias in conveyor_settings().databases():
            if allowed != "__all__" and alias not in allowed:
                continue  # pytest-django forbids the test's other databases
            for errors in Job.objects.using(alias).values_list("errors", flat=True):
                texts += [entry["traceback"] for entry in errors]
    found = [text for text in texts if is_session_state_error(text)]
    assert not found, found[:3]
