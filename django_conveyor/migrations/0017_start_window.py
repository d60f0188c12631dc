"""The jobs a worker may have started: `conveyor_worker.may_start`.

A worker claims ahead deeply but starts only jobs its row lists (or any it
holds while the list is NULL, the default and the old rule). REAP reads the
list: a job its dead worker never listed cannot have killed it, so it goes
back with its attempt instead of into isolation (docs/guarantees.md, "Crash
containment"). A nullable column without a default: adding it rewrites
nothing.
"""

from django.db import migrations

import django_conveyor.models


class Migration(migrations.Migration):
    dependencies = [("conveyor", "0016_lean_job_layout")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="may_start",
            field=django_conveyor.models.JobIdsField(blank=True, null=True),
        ),
    ]
