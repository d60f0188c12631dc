"""The index consolidation runs on a table with data, both ways."""

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from django_conveyor.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATION = "0005_indexes"  # Drops conveyor_job_state_idx.


def indexes() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'conveyor_job'")
        return {name for (name,) in cursor.fetchall()}


def test_the_overlapping_state_index_is_dropped_and_restored_with_data():
    loader = MigrationLoader(connection)
    (before,) = loader.graph.node_map[("conveyor", MIGRATION)].parents
    JobFactory.create_batch(3, dead=True)
    try:
        call_command("migrate", "conveyor", before.key[1], verbosity=0)
        assert "conveyor_job_state_idx" in indexes()
    finally:
        call_command("migrate", "conveyor", verbosity=0)
    assert "conveyor_job_state_idx" not in indexes()
    assert {"conveyor_job_list_idx", "conveyor_job_dead_letter_idx"} <= indexes()
    assert Job.objects.filter(state="dead").count() == 3


def test_the_queue_led_claim_index_is_built_and_dropped_with_data():
    loader = MigrationLoader(connection)
    (before,) = loader.graph.node_map[("conveyor", "0007_claim_by_queue")].parents
    JobFactory.create_batch(3)
    try:
        call_command("migrate", "conveyor", before.key[1], verbosity=0)
        assert "conveyor_job_claim_queue_idx" not in indexes()
    finally:
        call_command("migrate", "conveyor", verbosity=0)
    assert "conveyor_job_claim_queue_idx" in indexes()
    assert Job.objects.filter(state="available").count() == 3


def test_the_lean_layout_is_built_and_reversed_with_data():
    """0016 leaves running rows out of the secondary indexes; its reverse puts them back."""
    loader = MigrationLoader(connection)
    (before,) = loader.graph.node_map[("conveyor", "0016_lean_job_layout")].parents
    JobFactory.create_batch(2, running=True, queue="emails")
    JobFactory.create_batch(2, queue="emails")

    def definitions() -> dict[str, str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'conveyor_job'"
            )
            return dict(cursor.fetchall())

    secondary = ("conveyor_job_queue_id_idx", "conveyor_job_task_id_idx", "conveyor_job_list_idx")
    try:
        call_command("migrate", "conveyor", before.key[1], verbosity=0)
        found = definitions()
        assert all(" WHERE " not in found[name] for name in secondary), found
        assert "(lease_expires_at) WHERE" in found["conveyor_job_reap_idx"]
    finally:
        call_command("migrate", "conveyor", verbosity=0)
    found = definitions()
    assert all(
        found[name].endswith("WHERE (NOT ((state)::text = 'running'::text))") for name in secondary
    )
    assert "(queue, lease_expires_at) WHERE" in found["conveyor_job_reap_idx"]
    assert not [name for name in found if name.endswith("_new")]
    assert Job.objects.filter(queue="emails", state="running").count() == 2
