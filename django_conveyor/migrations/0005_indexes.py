"""One index for state filters: `(state, queue, id)`, not also `(state, id) INCLUDE (queue)`.

The console (0003) made `conveyor_job_state_idx` `(state, id)` carrying the
queue, for its counts per queue and its state filter; the API (0004) made
`conveyor_job_list_idx` `(state, queue, id)` for its pages and the metrics'
loose index scans. Both start with the state and hold the same columns, and
every write that changes a job's state updates both. The counts now come from
`django_conveyor.stats` alone, which reads the list index; a state filter of
the console reads a range of it (or the primary key backwards for a state
that holds most of the table). So the console's index goes.

Dropped CONCURRENTLY, so a busy conveyor_job keeps taking writes; that cannot
run inside a transaction.
"""

from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("conveyor", "0004_api_keys"),
    ]

    operations = [
        RemoveIndexConcurrently(model_name="job", name="conveyor_job_state_idx"),
    ]
