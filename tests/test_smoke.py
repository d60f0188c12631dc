import pytest

from django_conveyor.models import Job
from tests.helpers import run_burst
from tests.testapp import tasks


@pytest.mark.django_db(transaction=True)
def test_enqueue_and_run():
    result = tasks.add.enqueue(2, 3)
    assert Job.objects.get(pk=result.id).state == "available"
    worker = run_burst()
    result.refresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 5
    assert worker.counters.counts["completed"] == 1
