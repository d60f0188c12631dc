"""The worker registry service against the real table."""

import datetime as dt

import pytest
from django.utils import timezone

from django_conveyor.models import Worker
from django_conveyor.worker.services import registry

pytestmark = pytest.mark.django_db(transaction=True)


def make(worker_id="host:1:abc", leases=0):
    info = registry.WorkerInfo(id=worker_id, queues=("default", "emails"), concurrency=4)
    return registry.Registry(info, leases_held=lambda: leases)


def test_register_refresh_and_stop(cur):
    reg = make(leases=3)
    reg.register(cur)
    row = Worker.objects.get()
    assert (row.id, row.queues, row.concurrency, row.leases_held) == (
        "host:1:abc",
        ["default", "emails"],
        4,
        0,
    )
    assert row.stopped_at is None and row.version
    first_seen = row.last_seen_at
    assert reg.run_once(cur, None) == (1, 0)
    row = Worker.objects.get()
    assert row.leases_held == 3 and row.last_seen_at >= first_seen
    reg.stop(cur)
    row = Worker.objects.get()
    assert row.stopped_at is not None and row.leases_held == 0


def test_a_row_forgotten_meanwhile_is_written_again_with_its_start(cur):
    reg = make()
    reg.register(cur)
    started = Worker.objects.get().started_at
    Worker.objects.all().delete()
    reg.run_once(cur, None)
    assert Worker.objects.get().started_at == started


def test_long_stopped_and_long_lost_rows_are_forgotten(cur):
    now = timezone.now()
    common = {"host": "h", "pid": 1, "queues": [], "concurrency": 1, "version": "x"}
    old = now - dt.timedelta(seconds=registry.STOPPED_RETENTION_SECONDS + 60)
    ancient = now - dt.timedelta(seconds=registry.LOST_RETENTION_SECONDS + 60)
    Worker.objects.create(id="stopped-long-ago", started_at=old, last_seen_at=old,
                          stopped_at=old, **common)  # fmt: skip
    Worker.objects.create(id="lost-long-ago", started_at=ancient, last_seen_at=ancient, **common)
    Worker.objects.create(id="lost-recently", started_at=old, last_seen_at=old, **common)
    reg = make()
    reg.register(cur)
    assert reg.run_once(cur, None).workers_forgotten == 2
    assert set(Worker.objects.values_list("id", flat=True)) == {"lost-recently", "host:1:abc"}


def test_the_first_pass_registers(cur):
    reg = make()
    assert reg.run_once(cur, None).registry_refreshed == 1
    assert Worker.objects.get().started_at is not None
