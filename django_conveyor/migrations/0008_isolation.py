"""Crash containment: the `isolated` flag and the indexes CLAIM_ISOLATED reads.

The column has a constant database default, so adding it to a large
conveyor_job is a catalog change, not a rewrite. The index is built
CONCURRENTLY (outside a transaction), so migrating does not block
enqueues or claims; both indexes hold only the rare isolated rows.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("conveyor", "0007_claim_by_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="isolated",
            field=models.BooleanField(db_default=False, default=False),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("isolated", True), ("state", "available")),
                name="conveyor_job_isolated_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                "lease_owner",
                condition=models.Q(("isolated", True), ("state", "running")),
                name="conveyor_job_isolated_held_idx",
            ),
        ),
    ]
