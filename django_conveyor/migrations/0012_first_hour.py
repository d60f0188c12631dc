"""Every timestamp and JSON column reads whatever a row holds (issue 21).

State only, no SQL: `readable.InstantField` selects a timestamp clamped to
what Python can show, and the JSON columns decode numbers past Python's
limits as Decimal, so a row written by hand or by a bug (1 BC, infinity, a
5,000-digit number) never breaks a page, an API answer or `get_result()`.
"""

from django.db import migrations, models

import django_conveyor.readable


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0011_gates"),
    ]

    operations = [
        migrations.AlterField(
            model_name="apikey",
            name="created_at",
            field=django_conveyor.readable.InstantField(),
        ),
        migrations.AlterField(
            model_name="apikey",
            name="last_used_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="apikey",
            name="revoked_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="apikey",
            name="scopes",
            field=models.JSONField(
                decoder=django_conveyor.readable.TolerantJSONDecoder, default=list
            ),
        ),
        migrations.AlterField(
            model_name="cron",
            name="args",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, default=list
            ),
        ),
        migrations.AlterField(
            model_name="cron",
            name="created_at",
            field=django_conveyor.readable.InstantField(auto_now_add=True),
        ),
        migrations.AlterField(
            model_name="cron",
            name="kwargs",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, default=dict
            ),
        ),
        migrations.AlterField(
            model_name="cron",
            name="last_tick_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="cron",
            name="next_tick_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="cron",
            name="updated_at",
            field=django_conveyor.readable.InstantField(auto_now=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="args",
            field=models.JSONField(
                decoder=django_conveyor.readable.TolerantJSONDecoder, default=list
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="cancel_requested_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="enqueued_at",
            field=django_conveyor.readable.InstantField(),
        ),
        migrations.AlterField(
            model_name="job",
            name="enqueued_run_after",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="errors",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, default=list
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="finished_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="gate",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="gate_deadline",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="history",
            field=models.JSONField(
                blank=True,
                db_default=models.Value([], models.JSONField()),
                decoder=django_conveyor.readable.TolerantJSONDecoder,
                default=list,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="kwargs",
            field=models.JSONField(
                decoder=django_conveyor.readable.TolerantJSONDecoder, default=dict
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="lease_expires_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="job",
            name="return_value",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="run_after",
            field=django_conveyor.readable.InstantField(),
        ),
        migrations.AlterField(
            model_name="job",
            name="started_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="applied_at",
            field=django_conveyor.readable.InstantField(),
        ),
        migrations.AlterField(
            model_name="ledgerentry",
            name="value",
            field=models.JSONField(
                blank=True, decoder=django_conveyor.readable.TolerantJSONDecoder, null=True
            ),
        ),
        migrations.AlterField(
            model_name="queue",
            name="paused_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="worker",
            name="last_seen_at",
            field=django_conveyor.readable.InstantField(),
        ),
        migrations.AlterField(
            model_name="worker",
            name="queues",
            field=models.JSONField(
                decoder=django_conveyor.readable.TolerantJSONDecoder, default=list
            ),
        ),
        migrations.AlterField(
            model_name="worker",
            name="started_at",
            field=django_conveyor.readable.InstantField(),
        ),
        migrations.AlterField(
            model_name="worker",
            name="stopped_at",
            field=django_conveyor.readable.InstantField(blank=True, null=True),
        ),
    ]
