# The operations console (issue 14): operator history, cancel requests,
# the worker registry, the admin's permissions and the indexes its filters use.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # The indexes are built CONCURRENTLY, so a busy conveyor_job keeps taking
    # writes while they build; that cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("conveyor", "0002_cron"),
    ]

    operations = [
        migrations.CreateModel(
            name="Worker",
            fields=[
                ("id", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("queues", models.JSONField(default=list)),
                ("concurrency", models.IntegerField()),
                ("started_at", models.DateTimeField()),
                ("last_seen_at", models.DateTimeField()),
                ("leases_held", models.IntegerField(default=0)),
                ("version", models.CharField(max_length=32)),
                ("stopped_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "conveyor_worker",
                "ordering": ["-started_at"],
            },
        ),
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("conveyor.queue",),
        ),
        migrations.AlterModelOptions(
            name="job",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("operate", "Can requeue and cancel jobs and pause queues"),
                    ("view_payloads", "Can see job arguments, return values and tracebacks"),
                ],
            },
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="cancel_requested_by",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="history",
            field=models.JSONField(
                blank=True, db_default=models.Value([], models.JSONField()), default=list
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                fields=["state", "id"], include=("queue",), name="conveyor_job_state_idx"
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="conveyor_job_state_queue_idx"),
        RemoveIndexConcurrently(model_name="job", name="conveyor_job_finished_idx"),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("state__in", ["completed", "failed", "dead", "cancelled"])),
                fields=["finished_at", "queue"],
                include=("state",),
                name="conveyor_job_finished_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(models.F("queue"), models.F("id"), name="conveyor_job_queue_id_idx"),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("task_path"), models.F("id"), name="conveyor_job_task_id_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("id"),
                condition=models.Q(("state__in", ["failed", "dead"])),
                name="conveyor_job_dead_letter_idx",
            ),
        ),
    ]
