"""The run_after a job was enqueued with (issue 9).

get_result() describes the job as it was enqueued, after retries and
snoozes have moved run_after. Nullable with no default: no table rewrite.
Jobs enqueued before this migration report no run_after.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("conveyor", "0008_isolation"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="enqueued_run_after",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
