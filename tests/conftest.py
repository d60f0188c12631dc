import subprocess

import pytest

from tests.helpers import clear_task_caches, kill_group


@pytest.fixture(autouse=True)
def _fresh_task_caches():
    clear_task_caches()
    yield


@pytest.fixture
def procs():
    """Processes a test starts; whatever is left of them is killed afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        kill_group(proc)
