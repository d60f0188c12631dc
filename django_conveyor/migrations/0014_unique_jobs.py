"""Unique jobs: a key per call, its period window and blocking states (issue 23).

Four nullable columns without a default, so no table rewrite, NULL for every
job without `unique`. The unique index's predicate reads the row's own
blocking states: the statement that moves a job out of them frees its key,
and a job without a key fails `unique_key IS NOT NULL` and has no entry in
either index, so its claims and completions write nothing more than before.
The second index holds the keyed jobs that released their key (its
predicate is the first one's complement), so a keyed job is in one of the
two: one index entry per state change, as for one more index.
The window is COALESCEd in the unique index because a key without a period
has none, and PostgreSQL 14 has no NULLS NOT DISTINCT.
"""

import datetime

import django.db.models.functions.comparison
from django.db import migrations, models

import django_conveyor.readable


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0013_observability"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unique_key",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_states",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="unique_window",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="uniqueness",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(
                    ("unique_key__isnull", False),
                    models.Q(("unique_states__has_key", models.F("state")), _negated=True),
                ),
                fields=["unique_key", "id"],
                name="conveyor_job_released_key_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="job",
            constraint=models.UniqueConstraint(
                models.F("unique_key"),
                django.db.models.functions.comparison.Coalesce(
                    "unique_window",
                    models.Value(datetime.datetime(1970, 1, 1, 0, 0, tzinfo=datetime.UTC)),
                ),
                condition=models.Q(
                    ("unique_key__isnull", False), ("unique_states__has_key", models.F("state"))
                ),
                name="conveyor_job_unique_key_uniq",
            ),
        ),
    ]
