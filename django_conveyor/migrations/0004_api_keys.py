"""API keys (issue 13), and the index that serves the API's pages and the metrics.

The job index is built CONCURRENTLY, so migrating a large conveyor_job
does not block enqueues or claims; that needs a migration outside a
transaction. `(state, queue, id)` gives one id-ordered range per (state,
queue) pair, which the API's pages and the metrics' loose index scans read
(docs/api.md, docs/metrics.md). The statistics object
lets the planner estimate finished jobs per (queue, state) for the metrics
without counting them (docs/metrics.md).
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

STATISTICS = "conveyor_job_state_queue_stats"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("conveyor", "0003_console"),
    ]

    operations = [
        migrations.CreateModel(
            name="ApiKey",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=100)),
                ("prefix", models.CharField(max_length=16, unique=True)),
                ("secret_hash", models.CharField(max_length=64)),
                ("scopes", models.JSONField(default=list)),
                ("created_at", models.DateTimeField()),
                ("last_used_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "API key",
                "verbose_name_plural": "API keys",
                "db_table": "conveyor_api_key",
                "ordering": ["name", "id"],
            },
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.UniqueConstraint(
                condition=models.Q(("revoked_at__isnull", True)),
                fields=("name",),
                name="conveyor_api_key_live_name",
            ),
        ),
        migrations.AddConstraint(
            model_name="apikey",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("scopes__contained_by", ["enqueue", "read", "operate", "metrics"])
                ),
                name="conveyor_api_key_scopes_known",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(fields=["state", "queue", "id"], name="conveyor_job_list_idx"),
        ),
        migrations.RunSQL(
            f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} (mcv) ON state, queue FROM conveyor_job",
            f"DROP STATISTICS IF EXISTS {STATISTICS}",
        ),
    ]
