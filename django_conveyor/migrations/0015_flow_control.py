"""Flow control: queue limits, the concurrency key, and the claim's bookkeeping (issue 22).

Nullable columns without a default (no table rewrite); a job without a key
has an entry in neither keyed index, so its enqueue, claim and completion
write what they wrote before. The claim's own bookkeeping on conveyor_queue
(the fair rotation's cursor and the rate window's log) is SQL only: no model
field, so no code but protocol.CLAIM_LIMITED reads or writes it, and typed
arrays, so nothing but numbers can be in the log.
"""

from django.db import migrations, models

import django_conveyor.readable


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0014_unique_jobs"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="concurrency",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="declared_limits",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AddField(
            model_name="queue",
            name="fair",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="queue",
            name="key_concurrency",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="limits_changed_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="limits_changed_by",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_count",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_seconds",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("concurrency_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("concurrency_key__isnull", False), ("state", "available")),
                name="conveyor_job_key_ready_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("queue"),
                models.F("concurrency_key"),
                condition=models.Q(("concurrency_key__isnull", False), ("state", "running")),
                name="conveyor_job_key_running_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("concurrency__isnull", True), ("concurrency__gte", 1), _connector="OR"
                ),
                name="conveyor_queue_concurrency_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("key_concurrency__isnull", True), ("key_concurrency__gte", 1), _connector="OR"
                ),
                name="conveyor_queue_key_concurrency_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="queue",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("rate_count__isnull", True), ("rate_seconds__isnull", True)),
                    models.Q(("rate_count__gte", 1), ("rate_seconds__gte", 1)),
                    _connector="OR",
                ),
                name="conveyor_queue_rate_valid",
            ),
        ),
        migrations.RunSQL(
            sql="""
            ALTER TABLE conveyor_queue
                ADD COLUMN fair_cursor varchar(255),
                ADD COLUMN rate_times float8[] NOT NULL DEFAULT '{}',
                ADD COLUMN rate_counts integer[] NOT NULL DEFAULT '{}';
        """,
            reverse_sql="""
            ALTER TABLE conveyor_queue
                DROP COLUMN fair_cursor, DROP COLUMN rate_times, DROP COLUMN rate_counts;
        """,
        ),
    ]
