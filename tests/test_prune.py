import datetime as dt

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_conveyor.models import Job, LedgerEntry
from tests.factories import JobFactory, LedgerEntryFactory

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "shard"])


def test_prunes_only_old_finished_jobs(capsys):
    old = timezone.now() - dt.timedelta(days=10)
    old_done = JobFactory(completed=True, finished_at=old)
    LedgerEntryFactory(job=old_done)
    old_dead = JobFactory(dead=True, finished_at=old)
    fresh = JobFactory(completed=True)
    waiting = JobFactory()
    running = JobFactory(running=True)
    call_command("conveyor_prune", "--older-than", str(7 * 24 * 3600), "--dry-run")
    assert "Would delete 2 finished job(s)" in capsys.readouterr().out
    assert Job.objects.count() == 5
    call_command("conveyor_prune", "--older-than", str(7 * 24 * 3600), "--batch-size", "1")
    assert "Deleted 2 finished job(s)" in capsys.readouterr().out
    assert set(Job.objects.values_list("id", flat=True)) == {fresh.id, waiting.id, running.id}
    assert not Job.objects.filter(pk__in=[old_done.id, old_dead.id]).exists()
    assert LedgerEntry.objects.count() == 0  # the ledger goes with its job
