"""Gates and checkpoints (issue 27): what a gate waits for, its deadline, a step's value.

`conveyor_job.gate` holds a gate's definition (NULL for every other job) and
`gate_deadline` the instant it stops waiting at the latest, set when it
starts to wait. Both indexes are partial: they hold waiting gates only, so a
job that is not a gate adds no entry to them. `conveyor_ledger.value` is the
recorded result of a checkpointed step.
"""

from django.db import migrations, models
from django.db.models.fields.json import KeyTextTransform


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0010_lean_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="WaitingGate",
            fields=[],
            options={
                "verbose_name": "waiting gate",
                "verbose_name_plural": "waiting (gates: approvals, signals, timers, conditions)",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("conveyor.job",),
        ),
        migrations.AddField(
            model_name="job",
            name="gate",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="gate_deadline",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="value",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                fields=["gate_deadline"],
                name="conveyor_job_gate_due_idx",
                condition=models.Q(state="blocked", gate_deadline__isnull=False),
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                KeyTextTransform("kind", "gate"),
                "id",
                name="conveyor_job_gate_waiting_idx",
                condition=models.Q(state="blocked", gate__isnull=False),
            ),
        ),
    ]
