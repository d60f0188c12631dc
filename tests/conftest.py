import pytest

from tests.helpers import clear_task_caches


@pytest.fixture(autouse=True)
def _fresh_task_caches():
    clear_task_caches()
    yield
