"""Observability: a job's progress, tags and metadata, their search indexes, attempt logs.

The new columns are nullable without a default: adding them to a large
conveyor_job is a catalog change, not a rewrite. The two GIN indexes are
partial (`IS NOT NULL`) so that a job without tags or meta has no entry in
them; they are built CONCURRENTLY (outside a transaction), so migrating
does not block enqueues or claims. They are SQL, not GinIndex, so that
django.contrib.postgres need not be an installed app.
"""

import django.db.models.deletion
from django.db import migrations, models

import django_conveyor.readable

SEARCH_INDEXES = {
    "conveyor_job_tags_idx": "tags jsonb_path_ops) WHERE tags IS NOT NULL",
    "conveyor_job_meta_idx": "meta jsonb_path_ops) WHERE meta IS NOT NULL",
}


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("conveyor", "0012_first_hour"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="progress",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="tags",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="meta",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        *(
            migrations.RunSQL(
                f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON conveyor_job USING gin ({spec}",
                reverse_sql=f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
            )
            for name, spec in SEARCH_INDEXES.items()
        ),
        migrations.CreateModel(
            name="JobLog",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("lease_version", models.BigIntegerField()),
                ("attempt", models.IntegerField()),
                ("worker", models.CharField(max_length=64)),
                (
                    "records",
                    models.JSONField(
                        decoder=django_conveyor.readable.TolerantJSONDecoder, default=list
                    ),
                ),
                ("dropped", models.IntegerField(default=0)),
                ("written_at", django_conveyor.readable.InstantField()),
                (
                    "job",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="logs",
                        to="conveyor.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "attempt log",
                "db_table": "conveyor_job_log",
                "ordering": ["job", "lease_version"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("job", "lease_version"), name="conveyor_job_log_attempt_uniq"
                    )
                ],
            },
        ),
    ]
